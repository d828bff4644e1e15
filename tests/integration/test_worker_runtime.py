"""Worker runtime under stress: progress-tied renewal, max_runtime, cancellation,
prefetch and shutdown — in process, against a real PostgreSQL."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import leaseq
from leaseq import JobStatus
from tests.support.helpers import make_available


def _app(dsn: str, schema: str) -> leaseq.App:
    return leaseq.App(dsn, schema=schema, retry_policy=leaseq.RetryPolicy(base=0.01, cap=0.05))


def _config(**overrides: Any) -> leaseq.WorkerConfig:
    settings: dict[str, Any] = {"poll_interval": 0.05, "lease_seconds": 30, "drain": True}
    settings.update(overrides)
    return leaseq.WorkerConfig(**settings)


def _job(client: leaseq.Client, job_id: int) -> leaseq.Job:
    job = client.get_job(job_id)
    assert job is not None
    return job


async def test_job_reporting_progress_keeps_its_lease_past_several_lease_lengths(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    app = _app(dsn, schema)

    @app.task(name="long")
    async def long(ctx: leaseq.JobContext, payload: Any) -> None:
        for _ in range(20):  # 2 s in all: more than four lease lengths
            await asyncio.sleep(0.1)
            ctx.progress()

    job_id = client.enqueue("long")
    stats = await asyncio.wait_for(leaseq.Worker(app, _config(lease_seconds=0.45)).run(), 30)
    job = _job(client, job_id)
    assert (job.status, job.lease_token, job.attempt_count) == (JobStatus.SUCCEEDED, 1, 1)
    assert stats.lost_leases == 0 and not stats.aborted


async def test_job_without_progress_is_stopped_and_retried(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    app = _app(dsn, schema)
    tokens: list[int] = []

    @app.task(name="stuck", max_attempts=2)
    async def stuck(ctx: leaseq.JobContext, payload: Any) -> None:
        tokens.append(ctx.fencing_token)
        await asyncio.sleep(30)  # never reports progress

    job_id = client.enqueue("stuck", max_attempts=2)
    started = time.monotonic()
    stats = await asyncio.wait_for(leaseq.Worker(app, _config(lease_seconds=0.6)).run(), 30)
    elapsed = time.monotonic() - started
    job = _job(client, job_id)
    assert tokens == [1, 2], "reclaimed once, under a new token"
    assert (job.status, job.last_error_code) == (JobStatus.DEAD, "NO_PROGRESS")
    assert stats.aborted == {"NO_PROGRESS": 2} and stats.lost_leases == 0
    assert elapsed < 10, "each attempt must stop after about a lease length, not at 30 s"
    assert [e.event for e in client.job_events(job_id)] == ["retry_scheduled", "dead"]


async def test_renew_alive_policy_keeps_a_silent_handler(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    app = _app(dsn, schema)

    @app.task(name="silent", renew="alive")
    async def silent(ctx: leaseq.JobContext, payload: Any) -> None:
        await asyncio.sleep(1.5)

    job_id = client.enqueue("silent")
    await asyncio.wait_for(leaseq.Worker(app, _config(lease_seconds=0.45)).run(), 30)
    assert (_job(client, job_id).status, _job(client, job_id).lease_token) == (
        JobStatus.SUCCEEDED,
        1,
    )


async def test_max_runtime_stops_a_handler_that_keeps_reporting_progress(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    app = _app(dsn, schema)
    attempts: list[int] = []

    @app.task(name="busy", max_runtime=0.5, renew="alive", max_attempts=2)
    def busy(ctx: leaseq.JobContext, payload: Any) -> None:
        attempts.append(ctx.attempt)
        while True:  # a sync handler: it learns of the abort through ctx.progress()
            time.sleep(0.02)
            ctx.progress()

    job_id = client.enqueue("busy", max_attempts=2)
    stats = await asyncio.wait_for(leaseq.Worker(app, _config(lease_seconds=5)).run(), 30)
    job = _job(client, job_id)
    assert attempts == [1, 2]
    assert (job.status, job.last_error_code) == (JobStatus.DEAD, "MAX_RUNTIME_EXCEEDED")
    assert job.last_error_detail and "max_runtime=0.5s" in job.last_error_detail
    assert stats.aborted == {"MAX_RUNTIME_EXCEEDED": 2}


async def test_max_runtime_is_enforced_when_it_passes_not_at_the_next_renewal_tick(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    """With a 600 s lease the keeper renews every 200 s; an async handler past its
    max_runtime of 0.3 s is stopped then (the keeper wakes for it), not at that tick: the
    run would otherwise outlast its 30 s bound (the handler never ends by itself)."""
    app = _app(dsn, schema)
    attempts: list[int] = []

    @app.task(name="forever", max_runtime=0.3, renew="alive", max_attempts=2)
    async def forever(ctx: leaseq.JobContext, payload: Any) -> None:
        attempts.append(ctx.attempt)
        await asyncio.Event().wait()

    job_id = client.enqueue("forever", max_attempts=2)
    stats = await asyncio.wait_for(leaseq.Worker(app, _config(lease_seconds=600)).run(), 30)
    job = _job(client, job_id)
    assert attempts == [1, 2]
    assert (job.status, job.last_error_code) == (JobStatus.DEAD, "MAX_RUNTIME_EXCEEDED")
    assert stats.aborted == {"MAX_RUNTIME_EXCEEDED": 2}


async def test_operator_cancel_stops_a_running_handler(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    app = _app(dsn, schema)
    started = asyncio.Event()

    @app.task(name="cancellable")
    async def cancellable(ctx: leaseq.JobContext, payload: Any) -> None:
        started.set()
        while True:
            await asyncio.sleep(0.05)
            ctx.progress()

    job_id = client.enqueue("cancellable")
    worker = leaseq.Worker(app, _config(lease_seconds=0.6))
    run = asyncio.create_task(worker.run())
    await asyncio.wait_for(started.wait(), 10)
    assert await asyncio.to_thread(client.cancel, job_id, actor="ops", reason="wrong customer")
    stats = await asyncio.wait_for(run, 10)
    job = _job(client, job_id)
    assert job.status is JobStatus.CANCELLED
    assert stats.aborted == {"CANCELLED": 1}
    assert [e.event for e in client.job_events(job_id)] == ["cancel_requested", "cancelled"]


async def test_shutdown_releases_unstarted_prefetched_leases_and_finishes_running_ones(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    app = _app(dsn, schema)
    release = asyncio.Event()
    started: list[int] = []

    @app.task(name="gate")
    async def gate(ctx: leaseq.JobContext, payload: Any) -> None:
        started.append(ctx.job_id)
        await release.wait()

    ids = client.enqueue_many([{"task": "gate"} for _ in range(6)])
    worker = leaseq.Worker(app, _config(concurrency=2, prefetch=2, drain=False))
    run = asyncio.create_task(worker.run())
    for _ in range(200):
        if len(started) == 2 and worker.running_count == 4:
            break
        await asyncio.sleep(0.02)
    assert len(started) == 2 and worker.running_count == 4, "2 running + 2 prefetched"
    worker.stop()
    await asyncio.sleep(0.3)
    release.set()
    stats = await asyncio.wait_for(run, 10)
    assert stats.succeeded == 2 and stats.released == 2
    by_status: dict[str, list[int]] = {}
    for job_id in ids:
        job = _job(client, job_id)
        by_status.setdefault(str(job.status), []).append(job.attempt_count)
    assert by_status["succeeded"] == [1, 1]
    assert by_status["pending"] == [0, 0, 0, 0], "released leases are not charged an attempt"


async def test_shutdown_timeout_abandons_and_reports_running_jobs(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    app = _app(dsn, schema)
    started = asyncio.Event()

    @app.task(name="forever", renew="alive")
    async def forever(ctx: leaseq.JobContext, payload: Any) -> None:
        started.set()
        await asyncio.sleep(3600)

    job_id = client.enqueue("forever")
    worker = leaseq.Worker(app, _config(drain=False, shutdown_timeout=0.3))
    run = asyncio.create_task(worker.run())
    await asyncio.wait_for(started.wait(), 10)
    worker.stop()
    stats = await asyncio.wait_for(run, 10)
    assert stats.abandoned_at_shutdown == 1
    assert leaseq.worker.runner.exit_code(stats) == 3
    job = _job(client, job_id)
    assert (job.status, job.last_error_code) == (JobStatus.PENDING, "WORKER_SHUTDOWN")
    make_available(dsn, schema)
    (again,) = client.claim(worker="next")
    assert again.job_id == job_id and again.attempt == 2


async def test_per_queue_lease_settings(dsn: str, schema: str, client: leaseq.Client) -> None:
    app = _app(dsn, schema)
    seen: dict[str, float] = {}

    @app.task(name="probe", queue="slow")
    async def probe(ctx: leaseq.JobContext, payload: Any) -> None:
        seen[ctx.queue] = ctx.lease.lease_seconds

    @app.task(name="probe_fast", queue="fast")
    async def probe_fast(ctx: leaseq.JobContext, payload: Any) -> None:
        seen[ctx.queue] = ctx.lease.lease_seconds

    client.enqueue("probe", queue="slow")
    client.enqueue("probe_fast", queue="fast")
    queues = (leaseq.QueueSettings.parse("slow:lease=120,batch=5"), "fast")
    await asyncio.wait_for(leaseq.Worker(app, _config(queues=queues, lease_seconds=7)).run(), 30)
    assert seen == {"slow": 120.0, "fast": 7.0}


async def test_worker_connections_run_generic_plans(dsn: str, schema: str) -> None:
    """The worker's own pool runs prepared statements on their generic plan: under the
    default, PostgreSQL re-planned the claim at every execution (about 15% of a drain).
    A plain client keeps the server's default."""
    app = leaseq.App(dsn, schema=schema)
    worker = leaseq.Worker(app)
    plain = leaseq.AsyncClient(dsn, schema=schema)
    try:
        async with worker.client.connection() as conn:
            row = await (await conn.execute("SHOW plan_cache_mode")).fetchone()
            assert row == ("force_generic_plan",)
        async with plain.connection() as conn:
            row = await (await conn.execute("SHOW plan_cache_mode")).fetchone()
            assert row == ("auto",)
    finally:
        await worker.client.close()
        await plain.close()


async def test_burst_worker_exits_though_a_background_task_lost_its_cancel(
    dsn: str,
    schema: str,
    client: leaseq.Client,  # the client fixture migrates the schema
) -> None:
    """Boundary: the worker stops while a maintenance service is waiting inside its tick,
    and the cancel is lost there (Python 3.11's wait_for drops a cancel that arrives with
    its result; psycopg_pool waits for a connection through it). The service goes back to
    sleep for its interval; the worker must still exit (a --burst worker hung in CI)."""
    from leaseq.worker.maintenance import PeriodicService

    class LosesOneCancel(PeriodicService):
        name = "loses one cancel"
        ticks = 0
        lost = False

        async def tick(self) -> None:
            self.ticks += 1
            if not self.lost:
                try:
                    await asyncio.sleep(3600)
                except asyncio.CancelledError:
                    self.lost = True  # swallowed, as wait_for did

    worker = leaseq.Worker(_app(dsn, schema), _config(drain=False, burst=True))
    service = LosesOneCancel(worker.client, worker.outage, interval=3600, timeout=5)
    worker._maintenance.append(service)
    run = asyncio.create_task(worker.run())
    done, _ = await asyncio.wait([run], timeout=20)  # a hang detector (the service sleeps 1 h)
    assert run in done, "the worker did not exit"
    assert run.result().succeeded == 0
    assert service.lost and service.ticks == 1, "the stop reached the service mid-tick"
