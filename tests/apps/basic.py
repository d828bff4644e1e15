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


@app.task(name="touch_then_sleep")
def touch_then_sleep(ctx: leaseq.JobContext, payload: Any) -> None:
    """Leaves a marker file (so a test knows the handler started), then works a while."""
    marker = pathlib.Path(payload["marker"])
    with marker.open("a") as f:
        f.write(f"{ctx.job_id}:{ctx.fencing_token}:{ctx.worker_id}\n")
    time.sleep(payload.get("seconds", 0))


@app.task(name="always_fails", max_attempts=3)
def always_fails(ctx: leaseq.JobContext, payload: Any) -> None:
    raise RuntimeError("upstream said no")
