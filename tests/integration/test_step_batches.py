"""The worker's group commit of step records (leaseq/worker/recorder.py) against a real
PostgreSQL: one statement records several jobs' steps, each row under its own lease's fence
(a stale lease, an ended one and a name already recorded are refused beside rows that are
recorded); a worker running many jobs of steps without a transaction shares its writes
between them, from async and sync handlers alike, and every step runs and is recorded once.
"""

from __future__ import annotations

import asyncio
import collections
from typing import Any

import leaseq
from leaseq import JobStatus
from tests.support.helpers import expire_lease, rows, run_sql


def test_one_batch_fences_each_row_by_its_own_lease(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    ids = [client.enqueue("t", {"n": n}) for n in range(3)]
    leases = {lease.job_id: lease for lease in client.claim(worker="w1", lease_seconds=30, limit=3)}
    live, ended, twice = (leases[i] for i in ids)
    assert client.step_record(twice, "s", 0, "first")
    expire_lease(dsn, schema, ended.job_id)
    client.sweep()
    run_sql(dsn, "UPDATE {s}.jobs SET available_at = now() WHERE status = 'pending'", schema)
    (again,) = client.claim(worker="w2", lease_seconds=30)  # the ended lease's job, token 2
    assert again.job_id == ended.job_id and again.token == ended.token + 1
    recorded = client.step_records_batch(
        [
            (live, "s", 0, '"live"'),
            (ended, "s", 0, '"stale"'),  # the job's old lease: refused
            (again, "s", 0, '"current"'),  # the same job's current lease, in the same batch
            (twice, "s", 1, '"second"'),  # a record of this name committed already
            (live, "t", 1, '"live too"'),
        ]
    )
    assert recorded == {
        (live.job_id, live.token, "s"),
        (again.job_id, again.token, "s"),
        (live.job_id, live.token, "t"),
    }
    stored = rows(
        dsn, "SELECT job_id, name, lease_token, result FROM {s}.job_steps ORDER BY 1, 2", schema
    )
    assert stored == sorted(
        [
            (live.job_id, "s", live.token, "live"),
            (live.job_id, "t", live.token, "live too"),
            (again.job_id, "s", again.token, "current"),
            (twice.job_id, "s", twice.token, "first"),
        ]
    )


async def test_a_worker_shares_its_step_writes_between_jobs_sync_and_async(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    app = leaseq.App(dsn, schema=schema)
    calls: collections.Counter[tuple[int, str]] = collections.Counter()

    def note(job_id: int, name: str) -> str:
        calls[(job_id, name)] += 1
        return f"{name}-{job_id}"

    @app.task(name="steps_async", store_result=True)
    async def steps_async(ctx: leaseq.JobContext, payload: Any) -> list[Any]:
        return [await ctx.step_async(n, note, ctx.job_id, n) for n in ("a", "b", "c")]

    @app.task(name="steps_sync", store_result=True)
    def steps_sync(ctx: leaseq.JobContext, payload: Any) -> list[Any]:
        return [ctx.step(n, note, ctx.job_id, n) for n in ("a", "b", "c")]

    ids = [client.enqueue("steps_async") for _ in range(40)]
    ids += [client.enqueue("steps_sync") for _ in range(40)]
    worker = leaseq.Worker(app, leaseq.WorkerConfig(concurrency=10, drain=True, poll_interval=0.05))
    stats = await asyncio.wait_for(worker.run(), 120)
    assert stats.succeeded == 80, stats
    for job_id in ids:
        job = client.get_job(job_id)
        assert job is not None and job.status is JobStatus.SUCCEEDED, job
        assert client.result(job_id) == [f"{n}-{job_id}" for n in ("a", "b", "c")]
    assert set(calls.values()) == {1} and len(calls) == 240, "each step ran once"
    ((count,),) = rows(dsn, "SELECT count(*) FROM {s}.job_steps", schema)
    assert count == 240
    recorder = worker._executor._recorder
    assert recorder.records == 240
    assert recorder.batches < recorder.records, "writes were shared between jobs"
