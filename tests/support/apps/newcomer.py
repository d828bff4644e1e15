"""Tasks for the issue-30 worker tests (`tests.support.apps.newcomer:app`): one held back by
a rate limit, one that always fails, one that is paused by the test."""

from __future__ import annotations

from typing import Any

import leaseq

app = leaseq.App(retry_policy=leaseq.RetryPolicy(base=0.01, cap=0.02))


@app.task(name="limited.ping", rate_limit=leaseq.RateLimit(rate=10, per=1.0, burst=1))
def ping(ctx: leaseq.JobContext, payload: Any) -> None:
    pass


@app.task(name="flaky.upstream", max_attempts=2)
def upstream(ctx: leaseq.JobContext, payload: Any) -> None:
    raise RuntimeError("upstream said no")


@app.task(name="held.report", queue="reports")
def report(ctx: leaseq.JobContext, payload: Any) -> None:
    pass
