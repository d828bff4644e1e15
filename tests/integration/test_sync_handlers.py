"""Sync handlers on the worker's handler threads, in process, against a real PostgreSQL.

Boundaries: the concurrency bound holds for sync and async handlers together; a long sync
handler does not hold up short ones beside it, nor its own lease renewal; a sync handler
that raises (even ``SystemExit``) has its failure reported at once; an operator cancel
reaches a running sync handler; one past ``max_runtime`` is stopped in its thread and
retried only once that thread has ended (with and without tracing); shutdown in the
middle of a batch finishes what started and releases what did not, and nothing released
ever ran.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

import leaseq
from leaseq import JobStatus


def _app(dsn: str, schema: str) -> leaseq.App:
    return leaseq.App(dsn, schema=schema, retry_policy=leaseq.RetryPolicy(base=0.01, cap=0.05))


def _config(**overrides: Any) -> leaseq.WorkerConfig:
    settings: dict[str, Any] = {"poll_interval": 0.05, "lease_seconds": 30, "drain": True}
    settings.update(overrides)
    return leaseq.WorkerConfig(**settings)


class _Gauge:
    """How many handlers run at once, across threads and the loop."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.now = 0
        self.most = 0

    def __enter__(self) -> None:
        with self._lock:
            self.now += 1
            self.most = max(self.most, self.now)

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self.now -= 1


async def test_many_short_sync_jobs_beside_a_long_one_all_run_once_within_the_bound(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    app = _app(dsn, schema)
    gauge = _Gauge()
    runs: dict[int, int] = {}
    shorts_done = threading.Event()
    short_count = 300

    @app.task(name="short")
    def short(ctx: leaseq.JobContext, payload: Any) -> None:
        with gauge:
            runs[ctx.job_id] = runs.get(ctx.job_id, 0) + 1
            if sum(1 for n in runs.values() if n) >= short_count + 1:
                shorts_done.set()

    @app.task(name="long", renew="alive")
    def long(ctx: leaseq.JobContext, payload: Any) -> None:
        with gauge:
            runs[ctx.job_id] = runs.get(ctx.job_id, 0) + 1
            # Holds its thread until every short job ran: they must not queue behind it.
            assert shorts_done.wait(20), "short jobs were held up behind a long one"

    long_id = client.enqueue("long")
    ids = [int(r) for r in client.enqueue_many([leaseq.JobSpec("short")] * short_count)]
    stats = await asyncio.wait_for(
        leaseq.Worker(app, _config(concurrency=4, batch_size=50)).run(), 60
    )
    assert stats.succeeded == short_count + 1 and stats.failed == 0
    assert runs == dict.fromkeys([long_id, *ids], 1), "every job ran exactly once"
    assert gauge.most <= 4, f"{gauge.most} handlers ran at once with concurrency=4"


async def test_sync_and_async_handlers_share_the_concurrency_bound(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    app = _app(dsn, schema)
    gauge = _Gauge()

    @app.task(name="s")
    def s(ctx: leaseq.JobContext, payload: Any) -> None:
        with gauge:
            time.sleep(0.02)

    @app.task(name="a")
    async def a(ctx: leaseq.JobContext, payload: Any) -> None:
        with gauge:
            await asyncio.sleep(0.02)

    client.enqueue_many([leaseq.JobSpec("s"), leaseq.JobSpec("a")] * 30)
    stats = await asyncio.wait_for(leaseq.Worker(app, _config(concurrency=3, prefetch=3)).run(), 60)
    assert stats.succeeded == 60
    assert 2 <= gauge.most <= 3, f"{gauge.most} handlers ran at once with concurrency=3"


async def test_a_raising_sync_handler_is_reported_and_the_worker_goes_on(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    app = _app(dsn, schema)

    @app.task(name="boom", max_attempts=1)
    def boom(ctx: leaseq.JobContext, payload: Any) -> None:
        raise ValueError("boom")

    @app.task(name="exits", max_attempts=1)
    def exits(ctx: leaseq.JobContext, payload: Any) -> None:
        raise SystemExit(3)  # a pool thread has nobody to hand this on to

    @app.task(name="fine")
    def fine(ctx: leaseq.JobContext, payload: Any) -> int:
        return 7

    boom_id = client.enqueue("boom", max_attempts=1)
    exits_id = client.enqueue("exits", max_attempts=1)
    fine_ids = [int(r) for r in client.enqueue_many([leaseq.JobSpec("fine")] * 20)]
    stats = await asyncio.wait_for(leaseq.Worker(app, _config(concurrency=5)).run(), 30)
    assert (stats.succeeded, stats.failed, stats.lost_leases) == (20, 2, 0)
    for job_id, text in ((boom_id, "ValueError: boom"), (exits_id, "SystemExit: 3")):
        job = client.get_job(job_id)
        assert job is not None and job.status == JobStatus.DEAD
        assert job.last_error_detail is not None and text in job.last_error_detail
    assert all((j := client.get_job(i)) and j.status == JobStatus.SUCCEEDED for i in fine_ids)


async def test_a_long_sync_handler_keeps_its_lease_and_an_operator_cancel_reaches_it(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    app = _app(dsn, schema)
    seen: list[str] = []

    @app.task(name="steady", renew="alive")
    def steady(ctx: leaseq.JobContext, payload: Any) -> None:
        time.sleep(1.5)  # several lease lengths without a word: renewals go on meanwhile

    @app.task(name="loops")
    def loops(ctx: leaseq.JobContext, payload: Any) -> None:
        seen.append("started")
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            ctx.progress()  # raises JobAborted once the cancel arrives
            time.sleep(0.02)

    steady_id = client.enqueue("steady")
    loops_id = client.enqueue("loops")
    worker = leaseq.Worker(app, _config(lease_seconds=0.45, drain=False))
    run = asyncio.create_task(worker.run())
    while not seen:
        await asyncio.sleep(0.02)
    await asyncio.to_thread(client.cancel, loops_id)
    while (job := await asyncio.to_thread(client.get_job, loops_id)) and job.status not in (
        JobStatus.CANCELLED,
        JobStatus.DEAD,
    ):
        await asyncio.sleep(0.02)
    while (job := await asyncio.to_thread(client.get_job, steady_id)) and (
        job.status != JobStatus.SUCCEEDED
    ):
        await asyncio.sleep(0.02)
    worker.stop()
    stats = await asyncio.wait_for(run, 20)
    loops_job = client.get_job(loops_id)
    assert loops_job is not None and loops_job.status == JobStatus.CANCELLED
    steady_job = client.get_job(steady_id)
    assert steady_job is not None and steady_job.lease_token == 1, "renewed, never reclaimed"
    assert stats.lost_leases == 0 and stats.aborted == {"CANCELLED": 1}


async def test_shutdown_mid_batch_finishes_started_sync_jobs_and_releases_the_rest(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    app = _app(dsn, schema)
    ran: list[int] = []
    gate = threading.Event()

    @app.task(name="held")
    def held(ctx: leaseq.JobContext, payload: Any) -> None:
        ran.append(ctx.job_id)
        assert gate.wait(20)

    ids = [int(r) for r in client.enqueue_many([leaseq.JobSpec("held")] * 12)]
    # Three slots, and three more leases claimed ahead of them, waiting for a slot.
    worker = leaseq.Worker(app, _config(concurrency=3, prefetch=3, drain=False))
    run = asyncio.create_task(worker.run())
    while len(ran) < 3 or worker.running_count < 6:
        await asyncio.sleep(0.01)
    worker.stop()
    await asyncio.sleep(0.2)  # the shutdown releases the unstarted leases meanwhile
    gate.set()
    stats = await asyncio.wait_for(run, 20)
    assert len(ran) == 3, "only the started jobs ran"
    assert stats.succeeded == 3 and stats.released == 3
    for job_id in ids:
        job = client.get_job(job_id)
        assert job is not None
        if job_id in ran:
            assert job.status == JobStatus.SUCCEEDED
        else:
            assert (job.status, job.attempt_count) == (JobStatus.PENDING, 0), "no attempt charged"


class _QuietTracing:
    """Tracing hooks that record nothing: with tracing on, a sync attempt is awaited by a
    task of its own (the other path through the executor)."""

    class _Scope:
        def sent(self, job_ids: Any) -> None:
            pass

        def finished(self, failure: Any) -> None:
            pass

        def carrier(self) -> None:
            return None

    @contextlib.contextmanager
    def send(self, jobs: Any) -> Iterator[_QuietTracing._Scope]:
        yield self._Scope()

    @contextlib.contextmanager
    def process(self, lease: Any, stored: Any) -> Iterator[_QuietTracing._Scope]:
        yield self._Scope()


@pytest.mark.parametrize("traced", [False, True], ids=["plain", "traced"])
async def test_a_sync_handler_past_max_runtime_is_stopped_before_its_retry_starts(
    dsn: str, schema: str, client: leaseq.Client, traced: bool
) -> None:
    """The soft stop lands in the handler's thread (it never calls ctx.progress()) when
    max_runtime has passed, not at the lease keeper's next renewal tick (100 s with this
    lease: the handler's 10 s loop would run out first), and the retry starts only after
    that thread has ended, though a second slot is free."""
    app = _app(dsn, schema)
    if traced:
        app.tracing = _QuietTracing()  # type: ignore[assignment]
    marks: list[tuple[str, int]] = []

    @app.task(name="overrun", max_runtime=0.3, renew="alive", max_attempts=2)
    def overrun(ctx: leaseq.JobContext, payload: Any) -> None:
        marks.append(("start", ctx.attempt))
        try:
            end = time.monotonic() + 10
            while time.monotonic() < end:
                time.sleep(0.01)
            marks.append(("ran out", ctx.attempt))  # max_runtime was not enforced in time
        finally:
            time.sleep(0.3)  # a clean-up: the retry must still wait for it
            marks.append(("end", ctx.attempt))

    job_id = client.enqueue("overrun", max_attempts=2)
    config = _config(concurrency=2, lease_seconds=300)
    stats = await asyncio.wait_for(leaseq.Worker(app, config).run(), 30)
    assert marks == [("start", 1), ("end", 1), ("start", 2), ("end", 2)]
    job = client.get_job(job_id)
    assert job is not None
    assert (job.status, job.last_error_code) == (JobStatus.DEAD, "MAX_RUNTIME_EXCEEDED")
    assert stats.soft_stops == 2 and stats.aborted == {"MAX_RUNTIME_EXCEEDED": 2}


async def test_a_traced_sync_attempt_whose_thread_is_stuck_ends_on_one_cancel_from_outside(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    """The boundary: the worker (or its loop) ends while a traced sync attempt, aborted
    from inside its thread (a fenced write refused: the lease was taken over), waits for a
    thread that does not end. asyncio's loop teardown cancels each task once; the attempt's
    task must end on that one cancel (before the fix it soft-stopped the thread and waited
    for it again, and the loop's close hung for ever) and report nothing under the lost
    lease."""
    app = _app(dsn, schema)
    app.tracing = _QuietTracing()  # type: ignore[assignment]
    started, go, lost, release = (threading.Event() for _ in range(4))

    @app.task(name="stuck", renew="alive")
    def stuck(ctx: leaseq.JobContext, payload: Any) -> None:
        started.set()
        go.wait(30)
        try:
            ctx.effect("e", lambda key: key)
        except leaseq.JobAborted:
            lost.set()
            release.wait()  # blocked in a C call: no soft stop lands until it returns

    job_id = client.enqueue("stuck")
    worker = asyncio.create_task(leaseq.Worker(app, _config(drain=False)).run())
    leftovers: set[asyncio.Task[Any]] = set()
    try:
        while not started.is_set():
            await asyncio.sleep(0.02)
        before = asyncio.all_tasks()
        with psycopg.connect(dsn, autocommit=True) as conn:  # another worker's claim, as it were
            conn.execute(
                sql.SQL("UPDATE {}.jobs SET lease_token = lease_token + 1 WHERE id = %s").format(
                    sql.Identifier(schema)
                ),
                (job_id,),
            )
        go.set()
        while not lost.is_set():
            await asyncio.sleep(0.02)
        worker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await worker
        leftovers = {t for t in before if not t.done() and t is not asyncio.current_task()}
        for task in leftovers:
            task.cancel()  # once, as the loop's teardown does
        _, pending = await asyncio.wait(leftovers, timeout=10) if leftovers else (set(), set())
        assert not pending, f"tasks still waiting after one cancel: {pending}"
    finally:
        release.set()
        go.set()
    job = client.get_job(job_id)
    assert job is not None and job.status == JobStatus.RUNNING  # nothing reported: it expires
