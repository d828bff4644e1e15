"""Tasks for tests that run real worker processes (`tests.support.apps.basic:app`)."""

from __future__ import annotations

import pathlib
import time
from typing import Any

import leaseq

app = leaseq.App(retry_policy=leaseq.RetryPolicy(base=0.01, cap=0.05))


@app.task(name="noop")
async def noop(ctx: leaseq.JobContext, payload: Any) -> None:
    pass


@app.task(name="touch_then_sleep", renew="alive")
def touch_then_sleep(ctx: leaseq.JobContext, payload: Any) -> None:
    """Leaves a marker line (job:token:worker, so a test knows who started what), then works
    for ``seconds`` — only under token ``sleep_token`` when that is given. With ``mark_end``
    it also leaves ``end:job:token`` when it returns: the file's order is then the real
    order of the handlers' starts and ends, across processes."""
    marker = pathlib.Path(payload["marker"])
    with marker.open("a") as f:
        f.write(f"{ctx.job_id}:{ctx.fencing_token}:{ctx.worker_id}\n")
    wanted = payload.get("sleep_token")
    if wanted is None or wanted == ctx.fencing_token:
        time.sleep(payload.get("seconds", 0))
    if payload.get("mark_end"):
        with marker.open("a") as f:
            f.write(f"end:{ctx.job_id}:{ctx.fencing_token}\n")


@app.task(name="sleepy")
def sleepy(ctx: leaseq.JobContext, payload: Any) -> None:
    time.sleep(payload.get("seconds", 0.005) if isinstance(payload, dict) else 0.005)


@app.task(name="always_fails", max_attempts=3)
def always_fails(ctx: leaseq.JobContext, payload: Any) -> None:
    raise RuntimeError("upstream said no")


def _tick_seconds(ctx: leaseq.JobContext, payload: Any) -> float:
    return float(payload["seconds"] if ctx.fencing_token == 1 else payload.get("later", 0.3))


def _tick(ctx: leaseq.JobContext, payload: Any) -> None:
    with pathlib.Path(payload["marker"]).open("a") as f:
        f.write(f"{ctx.fencing_token} {time.time():.4f}\n")


@app.task(name="ticker")
async def ticker(ctx: leaseq.JobContext, payload: Any) -> None:
    """Records a timestamped tick every 20 ms while it works, reporting progress each time:
    lets a test see exactly when each attempt was running."""
    import asyncio

    end = time.monotonic() + _tick_seconds(ctx, payload)
    while time.monotonic() < end:
        _tick(ctx, payload)
        ctx.progress()
        await asyncio.sleep(0.02)


@app.task(name="ticker_sync")
def ticker_sync(ctx: leaseq.JobContext, payload: Any) -> None:
    end = time.monotonic() + _tick_seconds(ctx, payload)
    while time.monotonic() < end:
        _tick(ctx, payload)
        ctx.progress()  # raises once the worker gave up on this attempt
        time.sleep(0.02)


@app.task(name="batch_callback")
def batch_callback(ctx: leaseq.JobContext, payload: Any) -> None:
    """A batch callback: one line per run (kind and counts) in the marker its payload names."""
    with pathlib.Path(payload["payload"]["marker"]).open("a") as f:
        f.write(f"{payload['kind']} {payload['succeeded']}/{payload['total']}\n")
