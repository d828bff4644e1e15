"""Worker boundaries, in process against a real PostgreSQL: a claim that returns after its
lease ended, and a claim that fails on a bad row. Each names the boundary it breaks."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import psycopg
import pytest
from psycopg import sql

import leaseq
from leaseq import JobStatus
from tests.support.helpers import claim_waits_on_a_lock, run_sql
from tests.support.procs import wait_for


def _app(dsn: str, schema: str) -> leaseq.App:
    return leaseq.App(dsn, schema=schema, retry_policy=leaseq.RetryPolicy(base=0.01, cap=0.05))


def _enqueue_behind_a_lock(
    dsn: str, schema: str, client: leaseq.Client, task: str, hold: float
) -> int:
    """Enqueue ``task`` in a transaction holding ``jobs`` locked; once the worker's claim is
    blocked on that lock, keep it blocked ``hold`` more seconds, then commit."""
    with psycopg.connect(dsn) as conn:
        conn.execute(
            sql.SQL("LOCK TABLE {}.jobs IN ACCESS EXCLUSIVE MODE").format(sql.Identifier(schema))
        )
        job_id = client.enqueue(task, connection=conn)
        wait_for(lambda: claim_waits_on_a_lock(dsn, schema), 10, "the claim to wait on the lock")
        time.sleep(hold)
        conn.commit()
    return job_id


@pytest.mark.parametrize("kind", ["async", "sync"])
async def test_claim_returning_after_its_lease_ended_never_starts_the_handler(
    dsn: str, schema: str, client: leaseq.Client, kind: str
) -> None:
    """Boundary: the claim's round trip. The claim waits on a table lock for longer than the
    lease, so it returns a lease that already ended. Invariant: no handler runs under that
    token (nothing is reported under it either); the sweeper recovers the job, and it runs
    once, under the next token."""
    app = _app(dsn, schema)
    tokens: list[int] = []

    if kind == "async":

        @app.task(name="mark")
        async def mark(ctx: leaseq.JobContext, payload: Any) -> None:
            tokens.append(ctx.fencing_token)

    else:

        @app.task(name="mark")
        def mark_sync(ctx: leaseq.JobContext, payload: Any) -> None:
            tokens.append(ctx.fencing_token)

    config = leaseq.WorkerConfig(
        lease_seconds=0.5, poll_interval=0.05, sweep_interval=0.1, listen=False
    )
    worker = leaseq.Worker(app, config)
    run = asyncio.create_task(worker.run())
    job_id = await asyncio.to_thread(_enqueue_behind_a_lock, dsn, schema, client, "mark", 1.0)

    async def succeeded() -> None:
        while (job := await asyncio.to_thread(client.get_job, job_id)) is None or (
            job.status is not JobStatus.SUCCEEDED
        ):
            await asyncio.sleep(0.05)

    await asyncio.wait_for(succeeded(), 20)
    worker.stop()
    stats = await asyncio.wait_for(run, 10)
    job = client.get_job(job_id)
    assert job is not None and job.lease_token == 2
    assert tokens == [2], "the handler started under the ended lease (token 1)"
    assert stats.late_starts == 1 and stats.succeeded == 1
    assert worker.metrics.registry.get_sample_value("leaseq_late_starts_total") == 1
    assert [e.event for e in client.job_events(job_id)] == ["lease_expired"]


async def test_a_claim_failing_on_a_bad_row_does_not_stop_the_worker(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    """Boundary: a claim statement that fails on data. A trigger makes claiming any job of
    queue ``bad`` raise numeric_value_out_of_range (as ``attempt_count + 1`` overflowing an
    int4 does; a trigger keeps the test independent of how the claim SQL handles that row).
    Invariant: the error is counted, that queue is backed off, and the worker keeps running
    and keeps processing the other queue's jobs, including ones enqueued later."""
    run_sql(
        dsn,
        """
        CREATE FUNCTION {s}.refuse_bad_claims() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
          IF NEW.queue_name = 'bad' AND NEW.status = 'running' THEN
            RAISE EXCEPTION 'integer out of range' USING ERRCODE = 'numeric_value_out_of_range';
          END IF;
          RETURN NEW;
        END $$;
        CREATE TRIGGER refuse_bad_claims BEFORE UPDATE ON {s}.jobs
          FOR EACH ROW EXECUTE FUNCTION {s}.refuse_bad_claims();
        """,
        schema,
    )
    app = _app(dsn, schema)
    done: list[int] = []

    @app.task(name="good", queue="good")
    async def good(ctx: leaseq.JobContext, payload: Any) -> None:
        done.append(ctx.job_id)

    @app.task(name="poison", queue="bad")
    async def poison(ctx: leaseq.JobContext, payload: Any) -> None:
        raise AssertionError("a job of the bad queue must never be claimed here")

    bad_id = client.enqueue("poison", queue="bad")
    first = client.enqueue_many([{"task": "good", "queue": "good"} for _ in range(2)])
    config = leaseq.WorkerConfig(queues=("bad", "good"), poll_interval=0.05, listen=False)
    worker = leaseq.Worker(app, config)
    run = asyncio.create_task(worker.run())

    async def until(condition: Any) -> None:
        while not condition():
            assert not run.done(), "the worker stopped"
            await asyncio.sleep(0.02)

    await asyncio.wait_for(until(lambda: len(done) == 2 and worker.stats.claim_errors), 20)
    later = client.enqueue_many([{"task": "good", "queue": "good"} for _ in range(2)])
    await asyncio.wait_for(until(lambda: len(done) == 4), 20)
    assert not run.done()
    worker.stop()
    stats = await asyncio.wait_for(run, 10)
    assert sorted(done) == sorted([*first, *later])
    assert stats.claim_errors >= 1 and stats.succeeded == 4
    counted = worker.metrics.registry.get_sample_value(
        "leaseq_claim_errors_total", {"queue": "bad"}
    )
    assert counted is not None and counted == stats.claim_errors
    bad = client.get_job(bad_id)
    assert bad is not None and (bad.status, bad.attempt_count) == (JobStatus.PENDING, 0)
