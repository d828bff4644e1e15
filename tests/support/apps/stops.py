"""Sync handlers that overrun ``max_runtime``, for the real-stop tests
(``tests.support.apps.stops:app``; tests/acceptance/test_handler_stops.py).

Each writes its marks to ``payload["marker"]`` with one ``write`` per line (O_APPEND), so
lines from several processes never interleave: ``start``/``end`` around an attempt, and
``tick`` lines while one runs, each with the attempt and the process id.
"""

from __future__ import annotations

import os
import time
from typing import Any

import leaseq

app = leaseq.App(retry_policy=leaseq.RetryPolicy(base=0.01, cap=0.05))


def mark(payload: dict[str, Any], what: str, attempt: int) -> None:
    fd = os.open(payload["marker"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{what} {attempt} {os.getpid()} {time.monotonic():.4f}\n".encode())
    finally:
        os.close(fd)


@app.task(name="overrun", max_runtime=1.0, max_attempts=3, renew="alive")
def overrun(ctx: leaseq.JobContext, payload: Any) -> None:
    """Works for ``seconds`` (past max_runtime) in short sleeps, never calling
    ctx.progress(): only an exception raised in its thread can stop it early; then takes
    ``cleanup`` seconds to clean up."""
    mark(payload, "start", ctx.attempt)
    try:
        end = time.monotonic() + payload["seconds"]
        while time.monotonic() < end:
            time.sleep(0.02)
            mark(payload, "tick", ctx.attempt)
    finally:
        # A slow clean-up after the stop: longer than a lease when the test says so.
        time.sleep(payload.get("cleanup", 0))
        mark(payload, "end", ctx.attempt)


@app.task(name="stubborn", max_runtime=1.0, max_attempts=3, renew="alive")
def stubborn(ctx: leaseq.JobContext, payload: Any) -> None:
    """Its first attempt swallows everything, the soft stop included, and never returns;
    later attempts finish at once."""
    mark(payload, "start", ctx.attempt)
    if ctx.attempt > 1:
        mark(payload, "end", ctx.attempt)
        return
    while True:
        try:
            time.sleep(0.02)
            mark(payload, "tick", ctx.attempt)
        except BaseException:  # the point: a handler that cannot be stopped
            mark(payload, "swallowed", ctx.attempt)
