"""The worker: claim → handler → fenced completion, on a real PostgreSQL.

In-process tests drive ``Worker`` on an event loop; the process tests run
``leaseq worker`` as a real child process and kill it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import pathlib
import signal
import subprocess
import sys
import threading
import time
from typing import Any

import pytest

import leaseq
from leaseq import JobStatus, Permanent, Retry
from leaseq.owners import worker_of
from tests.support.helpers import expire_lease, rows, run_sql

BASIC_APP = "tests.support.apps.basic:app"

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _app(dsn: str, schema: str) -> leaseq.App:
    return leaseq.App(dsn, schema=schema, retry_policy=leaseq.RetryPolicy(base=0.01, cap=0.05))


def _config(**overrides: Any) -> leaseq.WorkerConfig:
    settings: dict[str, Any] = {"poll_interval": 0.05, "lease_seconds": 30, "drain": True}
    settings.update(overrides)
    return leaseq.WorkerConfig(**settings)


async def test_worker_drains_every_path_of_the_state_machine(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    app = _app(dsn, schema)
    seen_threads: set[str] = set()

    @app.task(name="ok_async")
    async def ok_async(ctx: leaseq.JobContext, payload: Any) -> None:
        assert ctx.job_id > 0 and ctx.attempt == 1

    @app.task(name="ok_sync")
    def ok_sync(ctx: leaseq.JobContext, payload: Any) -> None:
        seen_threads.add(threading.current_thread().name)

    @app.task(name="flaky", max_attempts=5)
    def flaky(ctx: leaseq.JobContext, payload: Any) -> None:
        if ctx.attempt < 3:
            raise Retry("TIMEOUT", retry_in=0.01)

    @app.task(name="broken", max_attempts=5)
    async def broken(ctx: leaseq.JobContext, payload: Any) -> None:
        raise Permanent("INVALID_PAYLOAD", "no amount")

    @app.task(name="crashes", max_attempts=3)
    def crashes(ctx: leaseq.JobContext, payload: Any) -> None:
        raise ZeroDivisionError("boom")

    ids = {
        "ok_async": [ok_async.name and client.enqueue("ok_async") for _ in range(20)],
        "ok_sync": [client.enqueue("ok_sync") for _ in range(20)],
        "flaky": [client.enqueue("flaky", max_attempts=5)],
        "broken": [client.enqueue("broken")],
        "crashes": [client.enqueue("crashes", max_attempts=3)],
        "unknown": [client.enqueue("nobody.handles.this")],
    }
    stats = await asyncio.wait_for(leaseq.Worker(app, _config(concurrency=4)).run(), 60)

    def status(job_id: int) -> leaseq.Job:
        job = client.get_job(job_id)
        assert job is not None
        return job

    assert all(status(i).status is JobStatus.SUCCEEDED for i in ids["ok_async"] + ids["ok_sync"])
    assert all(name.startswith("leaseq-job") for name in seen_threads)
    flaky_job = status(ids["flaky"][0])
    assert (flaky_job.status, flaky_job.attempt_count) == (JobStatus.SUCCEEDED, 3)
    broken_job = status(ids["broken"][0])
    assert (broken_job.status, broken_job.attempt_count, broken_job.last_error_code) == (
        JobStatus.DEAD,
        1,
        "INVALID_PAYLOAD",
    )
    crash_job = status(ids["crashes"][0])
    assert (crash_job.status, crash_job.attempt_count, crash_job.last_error_code) == (
        JobStatus.DEAD,
        3,
        "ZeroDivisionError",
    )
    assert crash_job.last_error_detail and "boom" in crash_job.last_error_detail
    unknown_job = status(ids["unknown"][0])
    assert (unknown_job.status, unknown_job.last_error_code) == (JobStatus.DEAD, "UNKNOWN_TASK")
    assert stats.succeeded == 41 and stats.lost_leases == 0


async def test_lost_lease_cancels_async_handler_and_reports_nothing(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    app = _app(dsn, schema)
    started = asyncio.Event()
    cancelled = asyncio.Event()

    @app.task(name="slow")
    async def slow(ctx: leaseq.JobContext, payload: Any) -> None:
        if ctx.fencing_token > 1:
            return  # a later claim (after a sweep) just finishes
        started.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        raise AssertionError("the first attempt must never get here")

    job_id = client.enqueue("slow")
    worker = leaseq.Worker(app, _config(lease_seconds=0.9, drain=False, shutdown_timeout=5))
    run = asyncio.create_task(worker.run())
    await asyncio.wait_for(started.wait(), 10)
    expire_lease(dsn, schema, job_id, seconds_ago=0.1)  # as if the worker had stalled
    await asyncio.wait_for(cancelled.wait(), 5)
    worker.stop()
    stats = await asyncio.wait_for(run, 10)
    assert stats.lost_leases == 1 and stats.failed == 0
    assert not [
        e
        for e in client.job_events(job_id)
        if e.lease_token == 1 and worker_of(e.actor or "") == worker.worker_id
    ]
    job = client.get_job(job_id)
    assert job is not None
    # Either nobody swept yet (still running under the dead token 1) or a later claim won;
    # never a success recorded under token 1.
    assert (job.status, job.lease_token) in {
        (JobStatus.RUNNING, 1),
        (JobStatus.PENDING, 1),
        (JobStatus.SUCCEEDED, 2),
    }


async def test_lost_lease_tells_sync_handler_through_ctx(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    app = _app(dsn, schema)
    observed: dict[str, Any] = {}
    started = threading.Event()

    @app.task(name="slow_sync")
    def slow_sync(ctx: leaseq.JobContext, payload: Any) -> None:
        if ctx.fencing_token > 1:
            return
        started.set()
        deadline = time.monotonic() + 10
        try:
            while not ctx.lease_lost and time.monotonic() < deadline:
                time.sleep(0.02)
        except leaseq.JobAborted as exc:
            # The worker's soft stop of an attempt whose lease was lost (docs/worker.md):
            # raised in this thread while it sleeps, before the loop sees the flag.
            observed["stopped"] = f"{type(exc).__name__}: {ctx.aborted}"
            observed["lost"] = ctx.lease_lost
            raise
        observed["lost"] = ctx.lease_lost
        try:
            ctx.progress()
        except leaseq.LeaseLost as exc:
            observed["raised"] = str(exc)

    job_id = client.enqueue("slow_sync")
    worker = leaseq.Worker(app, _config(lease_seconds=0.9, drain=False, shutdown_timeout=5))
    run = asyncio.create_task(worker.run())
    await asyncio.to_thread(started.wait, 10)
    expire_lease(dsn, schema, job_id, seconds_ago=0.1)
    for _ in range(100):
        if "lost" in observed:
            break
        await asyncio.sleep(0.05)
    worker.stop()
    stats = await asyncio.wait_for(run, 10)
    # Either way the handler learns it: through ctx (and progress() raising), or by the
    # soft stop raised in its thread, naming the lost lease.
    assert observed["lost"] is True
    assert "LEASE_LOST" in observed.get("raised", "") + observed.get("stopped", "")
    assert stats.lost_leases == 1
    job = client.get_job(job_id)
    assert job is not None and not (job.status is JobStatus.SUCCEEDED and job.lease_token == 1)


async def test_notify_wakes_an_idle_worker_before_its_poll(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    app = _app(dsn, schema)
    ran = asyncio.Event()

    @app.task(name="ping")
    async def ping(ctx: leaseq.JobContext, payload: Any) -> None:
        ran.set()

    worker = leaseq.Worker(app, _config(poll_interval=30, drain=False))
    run = asyncio.create_task(worker.run())
    await asyncio.sleep(1.0)  # let it settle into its 30 s poll wait with the listener up
    enqueued = time.monotonic()
    await asyncio.to_thread(client.enqueue, "ping")
    await asyncio.wait_for(ran.wait(), 5)
    latency = time.monotonic() - enqueued
    worker.stop()
    await asyncio.wait_for(run, 10)
    assert latency < 5, "only NOTIFY could have woken the worker this early"


async def test_polling_alone_drains_without_listen(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    app = _app(dsn, schema)

    @app.task(name="noop")
    async def noop(ctx: leaseq.JobContext, payload: Any) -> None:
        pass

    client.enqueue_many([{"task": "noop"} for _ in range(50)])
    stats = await asyncio.wait_for(leaseq.Worker(app, _config(listen=False)).run(), 30)
    assert stats.succeeded == 50


def test_bad_worker_settings_are_refused_up_front() -> None:
    for bad in (
        {"lease_seconds": 0},
        {"concurrency": -1},
        {"queues": ()},
        {"queues": ("bad queue",)},
        {"heartbeat_interval": 90, "lease_seconds": 60},
    ):
        with pytest.raises(leaseq.ConfigError):
            leaseq.WorkerConfig(**bad)  # type: ignore[arg-type]


# -- real worker processes --------------------------------------------------------------


def _worker_env(dsn: str, schema: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(LEASEQ_DSN=dsn, LEASEQ_SCHEMA=schema, PYTHONPATH=str(ROOT))
    return env


def _leaseq(*args: str) -> list[str]:
    return [sys.executable, "-m", "leaseq", *args]


def test_cli_worker_burst_drains_and_reports(dsn: str, schema: str, client: leaseq.Client) -> None:
    client.enqueue_many([{"task": "noop"} for _ in range(500)])
    result = subprocess.run(
        _leaseq("worker", BASIC_APP, "--burst", "--concurrency", "20"),
        env=_worker_env(dsn, schema),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    assert "processed 500 job(s)" in result.stdout
    ((left,),) = rows(dsn, "SELECT count(*) FROM {s}.jobs WHERE status <> 'succeeded'", schema)
    assert left == 0


def _has_line(path: pathlib.Path) -> bool:
    return path.exists() and path.read_text().endswith("\n")


def test_seed_2_worker_killed_after_claim_is_reclaimed_and_runs_once_more(
    dsn: str, schema: str, client: leaseq.Client, tmp_path: pathlib.Path
) -> None:
    marker = tmp_path / "started"
    job_id = client.enqueue("touch_then_sleep", {"marker": str(marker), "seconds": 60})
    victim = subprocess.Popen(
        _leaseq(
            "worker",
            BASIC_APP,
            "--lease-seconds",
            "2",
            "--poll-interval",
            "0.1",
        ),
        env=_worker_env(dsn, schema),
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        # The whole line, not just the file: the handler creates the file, then writes it;
        # a kill in between left an empty first run (seen on a loaded machine).
        while not _has_line(marker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _has_line(marker), "the worker never started the job"
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait(10)
    finally:
        if victim.poll() is None:
            victim.kill()
    job = client.get_job(job_id)
    assert job is not None and job.status is JobStatus.RUNNING  # the crash left it running
    # The survivor sweeps the expired lease (the kill left it to run out), then runs the job.
    rows(
        dsn,
        "UPDATE {s}.jobs SET payload = jsonb_set(payload, '{{seconds}}', '0') RETURNING 1",
        schema,
    )
    expire_lease(dsn, schema, job_id)
    survivor = subprocess.run(
        _leaseq(
            "worker",
            BASIC_APP,
            "--drain",
            "--poll-interval",
            "0.05",
            "--sweep-interval",
            "0.1",
        ),
        env=_worker_env(dsn, schema),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert survivor.returncode == 0, survivor.stderr
    job = client.get_job(job_id)
    assert job is not None and job.status is JobStatus.SUCCEEDED
    assert job.lease_token == 2 and job.attempt_count == 2
    runs = marker.read_text().splitlines()
    assert [line.split(":")[1] for line in runs] == ["1", "2"], "ran under token 1, then 2"


async def test_idle_worker_polls_at_its_interval_not_in_a_loop(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    """Regression: a finished job left "slot freed" set, and an idle worker then claimed
    in a tight loop (thousands of statements a second) instead of sleeping until its poll."""
    app = _app(dsn, schema)

    @app.task(name="noop")
    async def noop(ctx: leaseq.JobContext, payload: Any) -> None:
        pass

    client.enqueue("noop")
    worker = leaseq.Worker(app, _config(poll_interval=0.25, drain=False, listen=False))
    run = asyncio.create_task(worker.run())
    while worker.stats.succeeded < 1:
        await asyncio.sleep(0.02)
    before = _claims(worker)
    await asyncio.sleep(1.0)  # idle: about four polls
    idle_claims = _claims(worker) - before
    worker.stop()
    await asyncio.wait_for(run, 10)
    assert 1 <= idle_claims <= 12, f"{idle_claims} claim statements in one idle second"


def _claims(worker: leaseq.Worker) -> int:
    for metric in worker.metrics.registry.collect():
        if metric.name == "leaseq_claim_statement_seconds":
            for sample in metric.samples:
                if sample.name.endswith("_count"):
                    return int(sample.value)
    return 0


@pytest.mark.parametrize("claims_in_flight", [1, 3])
async def test_claims_in_flight_never_overfill_slots_and_end_a_burst_at_once(
    dsn: str, schema: str, client: leaseq.Client, claims_in_flight: int
) -> None:
    """Several claim statements run at once while the queue is busy. Together they must
    never ask for more jobs than there are free slots (a lease holds its slot until its
    handler's outcome is handed to the completer, not until that commits: docs/worker.md,
    at most --prefetch leases waiting for a slot), every job must run once, and each
    burst must end as soon as the queue is empty (a helper's claim in flight once kept the
    primary from concluding "idle", and the worker slept out a whole poll interval)."""
    app = _app(dsn, schema)
    ran: list[int] = []

    @app.task(name="noop")
    async def noop(ctx: leaseq.JobContext, payload: Any) -> None:
        await asyncio.sleep(0.001)
        ran.append(ctx.job_id)

    concurrency = 6
    most_in_flight = 0
    for _ in range(8):  # the missed wake-up depended on timing: give it several chances
        ran.clear()
        ids = client.enqueue_many([{"task": "noop"} for _ in range(150)])
        worker = leaseq.Worker(
            app,
            _config(
                concurrency=concurrency,
                batch_size=2,
                claims_in_flight=claims_in_flight,
                poll_interval=60,
                listen=False,
                drain=False,
                burst=True,
            ),
        )
        claim = worker.client.claim
        asked = {"in_flight": 0, "limits": 0, "claimed": 0, "overfill": 0, "handed": 0}
        submit = worker._completer.submit

        def watched_submit(
            *args: Any, _submit: Any = submit, _asked: Any = asked, **kwargs: Any
        ) -> None:
            _asked["handed"] += 1
            _submit(*args, **kwargs)

        async def watched_claim(
            *args: Any, _claim: Any = claim, _asked: Any = asked, **kwargs: Any
        ) -> list[leaseq.Lease]:
            nonlocal most_in_flight
            held = _asked["claimed"] - _asked["handed"]  # running or waiting for a slot
            if held + _asked["limits"] + kwargs["limit"] > concurrency:
                _asked["overfill"] += 1
            _asked["in_flight"] += 1
            _asked["limits"] += kwargs["limit"]
            most_in_flight = max(most_in_flight, _asked["in_flight"])
            try:
                leases: list[leaseq.Lease] = await _claim(*args, **kwargs)
            finally:
                _asked["in_flight"] -= 1
                _asked["limits"] -= kwargs["limit"]
            _asked["claimed"] += len(leases)
            return leases

        worker.client.claim = watched_claim  # type: ignore[method-assign]
        worker._completer.submit = watched_submit  # type: ignore[method-assign]
        stats = await asyncio.wait_for(worker.run(), 30)  # far below the 60 s poll
        assert stats.succeeded == 150 and sorted(ran) == sorted(ids)
        assert asked["overfill"] == 0
    if claims_in_flight == 1:
        assert most_in_flight == 1
    else:
        assert most_in_flight >= 2


async def test_a_busy_workers_next_claim_overlaps_the_completions_commit_up_to_its_slots(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    """Boundary: the completions of a busy worker held uncommitted (the completer's write
    stalls). A lease whose handler is done hands its slot to the next claim, so that claim
    does not wait for the commit; at most ``concurrency`` such leases count as free, so a
    stalled completer holds the claims back after one more round: exactly 2 x concurrency
    jobs run, none beyond, and all complete once the write goes through."""
    app = _app(dsn, schema)
    ran: list[int] = []

    @app.task(name="noop")
    async def noop(ctx: leaseq.JobContext, payload: Any) -> None:
        ran.append(ctx.job_id)

    concurrency = 2
    ids = client.enqueue_many([{"task": "noop"} for _ in range(7)])
    worker = leaseq.Worker(app, _config(concurrency=concurrency, batch_size=1))
    gate = asyncio.Event()
    complete = worker._completer._complete

    async def stalled(pending: Any) -> Any:
        await gate.wait()
        return await complete(pending)

    worker._completer._complete = stalled  # type: ignore[method-assign]
    run = asyncio.create_task(worker.run())
    for _ in range(400):
        if len(ran) >= 2 * concurrency:
            break
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.3)  # room for a claim that should not happen
    assert len(ran) == 2 * concurrency, "the first completions held; one more round ran"
    ((succeeded,),) = rows(dsn, "SELECT count(*) FROM {s}.jobs WHERE status = 'succeeded'", schema)
    assert succeeded == 0, "nothing committed while the write stalls"
    gate.set()
    stats = await asyncio.wait_for(run, 30)
    assert stats.succeeded == 7 and sorted(ran) == sorted(ids)


async def test_worker_stopped_during_an_extra_claim_exits(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    """Stop a worker while an extra claimer's claim is in flight, and let that claim come
    back short (the queue ran dry). It used to clear "busy" after the fetch loop's final
    wake-up and wait for it forever: the worker never exited (seen once under SIGTERM)."""
    app = _app(dsn, schema)

    @app.task(name="noop")
    async def noop(ctx: leaseq.JobContext, payload: Any) -> None:
        pass

    client.enqueue_many([{"task": "noop"} for _ in range(3)])
    worker = leaseq.Worker(
        app,
        _config(
            concurrency=8,
            batch_size=2,
            claims_in_flight=2,
            poll_interval=60,
            listen=False,
            drain=False,
        ),
    )
    claim = worker.client.claim
    in_flight = 0

    async def claim_then_stop(*args: Any, **kwargs: Any) -> list[leaseq.Lease]:
        nonlocal in_flight
        in_flight += 1
        try:
            if in_flight >= 2:  # the helper's claim, next to the primary's
                worker.stop()
                await asyncio.sleep(0.2)  # the fetch loop ends meanwhile
            leases: list[leaseq.Lease] = await claim(*args, **kwargs)
            return leases
        finally:
            in_flight -= 1

    worker.client.claim = claim_then_stop  # type: ignore[method-assign]
    stats = await asyncio.wait_for(worker.run(), 20)
    assert stats.succeeded == 3


async def test_worker_prune_round_removes_everything_eligible(
    dsn: str, schema: str, client: leaseq.Client, caplog: pytest.LogCaptureFixture
) -> None:
    """Retention must keep up with sustained load: one prune round deletes every finished
    job past retention (paced batches), not a fixed few batches. Ten batches a round let
    the table grow without end at 3,000 jobs/s (bench.sustained)."""
    client.migrate()
    old = 25_000
    run_sql(
        dsn,
        "INSERT INTO {s}.jobs (queue_name, task, payload, status, attempt_count, "
        "lease_token, finished_at) SELECT 'default', 'noop', '{{}}', 'succeeded', 1, 1, "
        "now() - interval '1 hour' FROM generate_series(1, %s)",
        schema,
        old,
    )
    client.enqueue("noop")  # a live job is never pruned
    app = _app(dsn, schema)

    @app.task(name="noop")
    async def noop(ctx: leaseq.JobContext, payload: Any) -> None:
        pass

    worker = leaseq.Worker(
        app,
        _config(retention=600, prune_interval=0.1, prune_share=0.5, drain=False, listen=False),
    )
    caplog.set_level(logging.INFO, logger="leaseq.worker")
    run = asyncio.create_task(worker.run())
    try:
        while not any("pruned" in r.getMessage() for r in caplog.records):
            await asyncio.sleep(0.05)
    finally:
        worker.stop()
        await asyncio.wait_for(run, 30)
    first = next(r.getMessage() for r in caplog.records if "pruned" in r.getMessage())
    assert first.startswith(f"pruned {old} finished job(s)")
    assert rows(dsn, "SELECT status, count(*) FROM {s}.jobs GROUP BY 1", schema) == [
        ("succeeded", 1)
    ]


async def test_an_extra_claimer_failing_stops_the_worker_with_its_error(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    """An unexpected error in an extra claimer must not vanish (the worker going on with one
    claimer less, the error seen by nobody): it ends the worker as the primary's would."""
    app = _app(dsn, schema)

    @app.task(name="noop")
    async def noop(ctx: leaseq.JobContext, payload: Any) -> None:
        await asyncio.sleep(0.01)

    client.enqueue_many([{"task": "noop"} for _ in range(200)])
    worker = leaseq.Worker(
        app, _config(concurrency=8, batch_size=2, claims_in_flight=2, drain=False, listen=False)
    )
    claim = worker.client.claim
    in_flight = 0

    async def failing_second_claim(*args: Any, **kwargs: Any) -> list[leaseq.Lease]:
        nonlocal in_flight
        in_flight += 1
        try:
            if in_flight >= 2:
                raise RuntimeError("claimer bug")
            leases: list[leaseq.Lease] = await claim(*args, **kwargs)
            return leases
        finally:
            in_flight -= 1

    worker.client.claim = failing_second_claim  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="claimer bug"):
        await asyncio.wait_for(worker.run(), 20)
