"""A gathering parent is woken by the end of its last unfinished child, in that ending's
transaction (jobs_child_ended, migration 31), against a real PostgreSQL: the last two
children ending at once in two transactions wake it exactly once, and it gets both
results; a child ending dead (a failure, with return_failures) or cancelled wakes it too.
Every gather here polls once an hour: only a child's end can wake it within the test."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import psycopg

import leaseq
from leaseq import JobStatus
from tests.support.helpers import rows


def _config(**overrides: Any) -> leaseq.WorkerConfig:
    settings: dict[str, Any] = {"poll_interval": 0.05, "lease_seconds": 30, "drain": True}
    settings.update(overrides)
    return leaseq.WorkerConfig(**settings)


def _status(client: leaseq.Client, job_id: int) -> JobStatus | None:
    job = client.get_job(job_id)
    return None if job is None else job.status


def _woken(dsn: str, schema: str, job_id: int) -> list[tuple[Any, ...]]:
    return rows(
        dsn,
        "SELECT detail FROM {s}.job_events WHERE job_id = %s AND event = 'woken'",
        schema,
        job_id,
    )


async def _until_suspended(client: leaseq.Client, job_id: int) -> None:
    for _ in range(400):
        if _status(client, job_id) is JobStatus.SUSPENDED:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"job {job_id} never suspended")


async def test_the_last_two_children_ending_at_once_wake_the_parent_exactly_once(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    app = leaseq.App(dsn, schema=schema)

    @app.task(name="pair", store_result=True)
    def pair(ctx: leaseq.JobContext, payload: Any) -> Any:
        ids = ctx.spawn_many(
            [("kid", {"n": 1}, {"queue": "kids"}), ("kid", {"n": 2}, {"queue": "kids"})]
        )
        return ctx.gather(ids, poll=3600)

    parent = client.enqueue("pair")
    first = leaseq.Worker(app, _config(drain=False))
    run = asyncio.create_task(first.run())
    await _until_suspended(client, parent)
    first.stop()
    await asyncio.wait_for(run, 30)
    leases = sorted(
        client.claim(queue="kids", worker="test", lease_seconds=60, limit=2), key=lambda x: x.job_id
    )
    assert len(leases) == 2
    results = {
        (lease.job_id, lease.token): (f'"r{i}"', 3600.0) for i, lease in enumerate(leases, 1)
    }
    one = psycopg.connect(dsn)
    two = psycopg.connect(dsn)
    try:
        # The first child's end, not committed: it holds the parent's gate row.
        assert client.complete_leases([leases[0]], results=results, connection=one)
        done = threading.Event()

        def end_the_other() -> None:
            with two.transaction():
                client.complete_leases([leases[1]], results=results, connection=two)
            done.set()

        other = threading.Thread(target=end_the_other)
        other.start()
        for _ in range(200):  # the second end waits for the gate, not for the first commit
            ((waiting,),) = rows(
                dsn, "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'", schema
            )
            if waiting:
                break
            await asyncio.sleep(0.05)
        assert waiting and not done.is_set(), "the second end waits for the first one's gate"
        assert _status(client, parent) is JobStatus.SUSPENDED
        one.commit()  # the first end sees the second child running: no wake
        other.join(30)
        assert done.is_set()
    finally:
        one.close()
        two.close()
    assert _status(client, parent) is JobStatus.PENDING, "the last end woke the parent"
    assert len(_woken(dsn, schema, parent)) == 1
    await asyncio.wait_for(leaseq.Worker(app, _config()).run(), 60)
    assert client.result(parent, timeout=5) == ["r1", "r2"]
    assert len(_woken(dsn, schema, parent)) == 1, "woken exactly once"


async def test_a_dead_or_cancelled_last_child_wakes_the_parent(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    app = leaseq.App(dsn, schema=schema)

    @app.task(name="ok", store_result=True)
    async def ok(ctx: leaseq.JobContext, payload: Any) -> int:
        return 1

    @app.task(name="boom", max_attempts=1)
    async def boom(ctx: leaseq.JobContext, payload: Any) -> None:
        raise RuntimeError("no")

    @app.task(name="outcomes", store_result=True)
    async def outcomes(ctx: leaseq.JobContext, payload: Any) -> Any:
        kids = [("ok", {}, {}), ("boom", {}, {}), ("ok", {}, {"queue": "never"})]
        ids = await ctx.spawn_many_async(kids)
        got = await ctx.gather_async(ids, poll=3600, return_failures=True)
        return [g["status"] for g in got]

    parent = client.enqueue("outcomes")
    worker = leaseq.Worker(app, _config(drain=False))
    run = asyncio.create_task(worker.run())
    await _until_suspended(client, parent)
    ((never,),) = rows(dsn, "SELECT id FROM {s}.jobs WHERE queue_name = 'never'", schema)
    for _ in range(400):  # the other two end on the worker; the parent keeps waiting
        ended = rows(
            dsn,
            "SELECT count(*) FROM {s}.jobs"
            " WHERE parent_id = %s AND status IN ('succeeded', 'dead')",
            schema,
            parent,
        )
        if ended == [(2,)]:
            break
        await asyncio.sleep(0.05)
    assert _status(client, parent) is JobStatus.SUSPENDED
    assert client.cancel(never, reason="not needed")  # the last child's end: cancelled
    for _ in range(400):
        if _status(client, parent) is JobStatus.SUCCEEDED:
            break
        await asyncio.sleep(0.05)
    worker.stop()
    await asyncio.wait_for(run, 30)
    assert client.result(parent, timeout=5) == ["succeeded", "dead", "cancelled"]
    assert len(_woken(dsn, schema, parent)) == 1
