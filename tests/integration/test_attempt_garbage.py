"""An attempt's objects are freed when it ends, by reference counting alone. The boundary
is the end of an attempt: a reference cycle there (say, a closure over the attempt's
record kept by its context, which the record holds) leaves every finished job's context,
lease and record to the cyclic garbage collector, which costs the worker CPU per job (6 us
measured, a quarter of a no-op job). With the collector off, no finished job's context
may survive its attempt, async or sync (a sync attempt's record and its thread job name each
other until the attempt leaves the in-flight table, which drops the record's task)."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

import pytest

import leaseq
from leaseq.worker.context import JobContext

JOBS = 200


@pytest.mark.parametrize("kind", ["async", "sync"])
async def test_finished_attempts_leave_no_context_for_the_cyclic_collector(
    dsn: str, schema: str, client: leaseq.Client, kind: str
) -> None:
    app = leaseq.App(dsn, schema=schema)

    @app.task(name="noop_async")
    async def noop_async(ctx: leaseq.JobContext, payload: Any) -> None:
        return None

    @app.task(name="noop_sync")
    def noop_sync(ctx: leaseq.JobContext, payload: Any) -> None:
        return None

    client.enqueue_many([{"task": f"noop_{kind}"}] * JOBS)
    gc.collect()
    gc.disable()
    try:
        config = leaseq.WorkerConfig(poll_interval=0.05, burst=True)
        stats = await asyncio.wait_for(leaseq.Worker(app, config).run(), 60)
        alive = sum(isinstance(o, JobContext) for o in gc.get_objects())
    finally:
        gc.enable()
    assert stats.succeeded == JOBS
    assert alive < 10, f"{alive} finished jobs' contexts are left to the cyclic collector"
