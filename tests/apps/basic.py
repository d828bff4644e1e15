"""Tasks used by tests that run real worker processes (`leaseq worker tests.apps.basic:app`)."""

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
    for ``seconds`` — only under token ``sleep_token`` when that is given."""
    marker = pathlib.Path(payload["marker"])
    with marker.open("a") as f:
        f.write(f"{ctx.job_id}:{ctx.fencing_token}:{ctx.worker_id}\n")
    wanted = payload.get("sleep_token")
    if wanted is None or wanted == ctx.fencing_token:
        time.sleep(payload.get("seconds", 0))


@app.task(name="sleepy")
def sleepy(ctx: leaseq.JobContext, payload: Any) -> None:
    time.sleep(payload.get("seconds", 0.005) if isinstance(payload, dict) else 0.005)


@app.task(name="always_fails", max_attempts=3)
def always_fails(ctx: leaseq.JobContext, payload: Any) -> None:
    raise RuntimeError("upstream said no")
