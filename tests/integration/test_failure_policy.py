"""Failure policy through the worker and the operator tools: classes, budgets, bad
payloads, redaction, bulk replay, purge, retention — on a real PostgreSQL."""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import subprocess
import sys
from typing import Any

import psycopg
import pytest
from psycopg import sql

import leaseq
from leaseq import JobStatus
from tests.support.helpers import rows, run_sql

ROOT = pathlib.Path(__file__).resolve().parents[2]
FAST = leaseq.RetryPolicy(base=0.001, cap=0.01)


def _app(dsn: str, schema: str, **kwargs: Any) -> leaseq.App:
    return leaseq.App(dsn, schema=schema, retry_policy=FAST, **kwargs)


async def _drain(app: leaseq.App, **overrides: Any) -> leaseq.WorkerStats:
    settings: dict[str, Any] = {"poll_interval": 0.02, "drain": True, "concurrency": 4}
    settings.update(overrides)
    return await asyncio.wait_for(leaseq.Worker(app, leaseq.WorkerConfig(**settings)).run(), 60)


def _job(client: leaseq.Client, job_id: int) -> leaseq.Job:
    job = client.get_job(job_id)
    assert job is not None
    return job


async def test_seed_6_transient_failure_ends_dead_after_exactly_max_attempts(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    app = _app(dsn, schema)

    @app.task(name="flaky_upstream", max_attempts=5)
    def flaky(ctx: leaseq.JobContext, payload: Any) -> None:
        raise leaseq.Retry("UPSTREAM_TIMEOUT", f"attempt {ctx.attempt} timed out")

    job_id = flaky.enqueue()
    await _drain(app)
    job = _job(client, job_id)
    assert (job.status, job.attempt_count, job.last_error_code, job.last_error_class) == (
        JobStatus.DEAD,
        5,
        "UPSTREAM_TIMEOUT",
        "transient",
    )
    trail = client.job_events(job_id)
    assert [e.event for e in trail] == ["retry_scheduled"] * 4 + ["dead"]
    assert trail[-1].detail and trail[-1].detail.startswith("all 5 attempts used")
    assert client.replay(job_id, reason="upstream fixed", actor="carol")
    replayed = client.job_events(job_id)[-1]
    assert (replayed.event, replayed.actor, replayed.detail) == (
        "replayed",
        "carol",
        "upstream fixed",
    )
    assert _job(client, job_id).job_id == job_id


async def test_unknown_exceptions_get_a_small_budget_and_full_diagnostics(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    app = _app(dsn, schema)

    @app.task(name="buggy", max_attempts=8)
    def buggy(ctx: leaseq.JobContext, payload: Any) -> None:
        return payload["missing"]  # KeyError: nobody classified it

    job_id = buggy.enqueue({"present": 1})
    await _drain(app)
    job = _job(client, job_id)
    assert (job.status, job.attempt_count, job.last_error_code, job.last_error_class) == (
        JobStatus.DEAD,
        3,
        "KeyError",
        "unknown",
    ), "unknown failures stop at unknown_attempts (3), not max_attempts (8)"
    assert job.last_error_detail and "Traceback" in job.last_error_detail
    assert 'payload["missing"]' in job.last_error_detail
    assert client.job_events(job_id)[-1].detail.startswith("3 failures of unknown cause")  # type: ignore[union-attr]


async def test_error_rules_classify_by_exception_type(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    app = _app(dsn, schema, error_rules={ValueError: "permanent", ConnectionError: "transient"})

    @app.task(name="parse", max_attempts=4)
    def parse(ctx: leaseq.JobContext, payload: Any) -> None:
        raise ValueError("not a number: 'abc'")

    @app.task(name="call", max_attempts=4)
    def call(ctx: leaseq.JobContext, payload: Any) -> None:
        raise ConnectionResetError("peer went away")

    @app.task(name="override", max_attempts=4, errors={ValueError: "transient"})
    def override(ctx: leaseq.JobContext, payload: Any) -> None:
        raise ValueError("the task says this one is worth retrying")

    ids = (parse.enqueue(), call.enqueue(), override.enqueue())
    await _drain(app)
    got = [
        (j.last_error_class, j.attempt_count, j.status) for j in map(lambda i: _job(client, i), ids)
    ]
    assert got == [
        ("permanent", 1, JobStatus.DEAD),
        ("transient", 4, JobStatus.DEAD),
        ("transient", 4, JobStatus.DEAD),
    ]


async def test_time_budget_ends_retries_early(dsn: str, schema: str, client: leaseq.Client) -> None:
    app = _app(dsn, schema)
    budget = leaseq.RetryPolicy(base=0.001, cap=0.01, max_elapsed=3600)

    @app.task(name="old_news", max_attempts=10, retry=budget)
    def old_news(ctx: leaseq.JobContext, payload: Any) -> None:
        raise leaseq.Retry("NOT_YET")

    job_id = old_news.enqueue()
    # The job was enqueued two hours ago (as far as the database knows).
    run_sql(dsn, "UPDATE {s}.jobs SET created_at = now() - interval '2 hours'", schema)
    await _drain(app)
    job = _job(client, job_id)
    assert (job.status, job.attempt_count) == (JobStatus.DEAD, 1)
    assert "time budget" in (client.job_events(job_id)[-1].detail or "")


async def test_bad_payloads_go_dead_with_a_code_and_the_worker_keeps_going(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    app = _app(dsn, schema)
    handled: list[Any] = []

    def positive_amount(payload: Any) -> int:
        if not isinstance(payload, dict) or not isinstance(payload.get("amount"), int):
            raise ValueError("amount must be an integer")
        if payload["amount"] <= 0:
            raise ValueError("amount must be positive")
        return int(payload["amount"])

    @app.task(name="charge", payload_versions=[2, 3], validate=positive_amount)
    def charge(ctx: leaseq.JobContext, amount: Any) -> None:
        handled.append(amount)

    with pytest.raises(leaseq.PayloadError, match="amount must be positive"):
        charge.enqueue({"amount": -5})  # refused while the caller is still there
    good = charge.enqueue({"amount": 7})
    assert _job(client, good).payload_version == 3, "tasks tag payloads with their newest version"
    # Jobs that bypass the task's checks (older producers, SQL, other languages):
    old_version = client.enqueue("charge", {"amount": 1}, payload_version=1)
    no_version = client.enqueue("charge", {"amount": 1})
    malformed = client.enqueue("charge", ["not", "an", "object"], payload_version=2)
    hostile = client.enqueue("charge", {"amount": "1; DROP TABLE jobs"}, payload_version=2)
    stats = await _drain(app)
    assert handled == [7], "the handler only ever saw the valid, converted payload"
    codes = {
        i: (_job(client, i).status, _job(client, i).last_error_code)
        for i in (old_version, no_version, malformed, hostile)
    }
    assert codes == {
        old_version: (JobStatus.DEAD, "UNSUPPORTED_PAYLOAD_VERSION"),
        no_version: (JobStatus.DEAD, "UNSUPPORTED_PAYLOAD_VERSION"),
        malformed: (JobStatus.DEAD, "INVALID_PAYLOAD"),
        hostile: (JobStatus.DEAD, "INVALID_PAYLOAD"),
    }
    assert _job(client, malformed).attempt_count == 1, "a bad payload is not retried"
    assert _job(client, good).status is JobStatus.SUCCEEDED
    assert stats.succeeded == 1 and stats.failed == 4
    ((jobs_table,),) = rows(dsn, "SELECT to_regclass(%s) IS NOT NULL", schema, f"{schema}.jobs")
    assert jobs_table, "the hostile payload was data, never SQL"


async def test_secrets_are_redacted_before_storage(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    app = _app(dsn, schema)

    @app.task(name="leaky", max_attempts=1)
    def leaky(ctx: leaseq.JobContext, payload: Any) -> None:
        raise ConnectionError(
            "could not reach postgresql://app:hunter2@db.internal/prod "
            "with Authorization: Bearer sk_live_abcdef123456"
        )

    job_id = leaky.enqueue()
    await _drain(app)
    stored = [_job(client, job_id).last_error_detail or ""]
    stored += [e.detail or "" for e in client.job_events(job_id)]
    assert all("hunter2" not in text and "sk_live_abcdef123456" not in text for text in stored)
    assert "postgresql://app:***@db.internal/prod" in stored[0]


def test_error_fields_are_bounded(client: leaseq.Client) -> None:
    job_id = client.enqueue("t", max_attempts=1)
    (lease,) = client.claim(worker="w")
    assert client.fail(lease, "X" * 500, detail="start " + "y" * 100_000 + " end")
    job = _job(client, job_id)
    assert job.last_error_code == "X" * 64
    assert job.last_error_detail is not None and len(job.last_error_detail) <= 4000
    assert job.last_error_detail.startswith("start") and job.last_error_detail.endswith("end")


def _dead_jobs(client: leaseq.Client, count: int, code: str, queue: str = "default") -> list[int]:
    ids = client.enqueue_many([{"task": "t", "queue": queue, "max_attempts": 1}] * count)
    while leases := client.claim(queue, worker="w", limit=100):
        for lease in leases:
            client.fail(lease, code, retryable=False)
    return ids


def _cli(dsn: str, schema: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, LEASEQ_DSN=dsn, LEASEQ_SCHEMA=schema)
    return subprocess.run(
        [sys.executable, "-m", "leaseq", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )


def test_bulk_replay_by_filter_with_dry_run(dsn: str, schema: str, client: leaseq.Client) -> None:
    timeouts = _dead_jobs(client, 1200, "TIMEOUT")
    others = _dead_jobs(client, 5, "BAD_INPUT")
    dry = _cli(dsn, schema, "replay", "--error-code", "TIMEOUT", "--reason", "x", "--dry-run")
    assert dry.returncode == 0 and dry.stdout.strip() == "would replay 1200 job(s)"
    assert client.count_jobs("dead") == 1205, "a dry run changes nothing"
    refused = _cli(dsn, schema, "replay", "--reason", "x")
    assert refused.returncode == 2 and "--all" in refused.stderr
    done = _cli(
        dsn, schema, "replay", "--error-code", "TIMEOUT", "--reason", "API back", "--actor", "dana"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "replayed 1200 job(s) by dana"
    assert {_job(client, i).status for i in timeouts} == {JobStatus.PENDING}
    assert {_job(client, i).status for i in others} == {JobStatus.DEAD}
    ((audited,),) = rows(
        dsn,
        "SELECT count(*) FROM {s}.job_events WHERE event = 'replayed' AND actor = 'dana' "
        "AND detail = 'API back'",
        schema,
    )
    assert audited == 1200


def test_dead_list_filters_by_age(dsn: str, schema: str, client: leaseq.Client) -> None:
    old = _dead_jobs(client, 2, "OLD")
    fresh = _dead_jobs(client, 3, "NEW")
    run_sql(
        dsn,
        "UPDATE {s}.jobs SET finished_at = now() - interval '3 days' WHERE last_error_code = 'OLD'",
        schema,
    )
    listed = json.loads(_cli(dsn, schema, "dead", "list", "--older-than", "1d", "--json").stdout)
    assert sorted(j["job_id"] for j in listed) == sorted(old)
    listed = json.loads(_cli(dsn, schema, "dead", "list", "--newer-than", "1h", "--json").stdout)
    assert sorted(j["job_id"] for j in listed) == sorted(fresh)
    bad = _cli(dsn, schema, "dead", "list", "--older-than", "soon")
    assert bad.returncode == 2 and "invalid duration" in bad.stderr


def test_purge_is_filtered_audited_and_keeps_the_trail(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    old = _dead_jobs(client, 3, "OLD")
    keep = _dead_jobs(client, 2, "NEW")
    run_sql(
        dsn,
        "UPDATE {s}.jobs SET finished_at = now() - interval '40 days' "
        "WHERE last_error_code = 'OLD'",
        schema,
    )
    unfiltered = _cli(dsn, schema, "dead", "purge", "--reason", "cleanup")
    assert unfiltered.returncode == 2 and "needs a filter" in unfiltered.stderr
    out = _cli(
        dsn,
        schema,
        "dead",
        "purge",
        "--older-than",
        "30d",
        "--reason",
        "past retention",
        "--actor",
        "ops",
    )
    assert out.returncode == 0 and "purged 3 dead job(s)" in out.stdout, out.stderr
    assert all(client.get_job(i) is None for i in old)
    assert all(client.get_job(i) is not None for i in keep)
    trail = client.job_events(old[0])
    assert [e.event for e in trail] == ["dead", "purged"]
    assert (trail[-1].actor, trail[-1].detail) == ("ops", "past retention")


def test_retention_prunes_only_old_finished_jobs(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    done = client.enqueue_many([{"task": "t"}] * 30)
    while leases := client.claim(worker="w", limit=50):
        for lease in leases:
            client.complete(lease)
    dead = _dead_jobs(client, 2, "X")
    pending = client.enqueue("t")
    cancelled = client.enqueue("t")
    client.cancel(cancelled)
    run_sql(
        dsn,
        "UPDATE {s}.jobs SET finished_at = now() - interval '10 days' WHERE status <> 'pending'",
        schema,
    )
    recent = client.enqueue("t")
    (lease,) = client.claim(worker="w")
    assert lease.job_id == pending
    client.complete(lease)  # finished just now: kept
    assert client.prune(older_than=7 * 86400, batch_size=7) == 31  # 30 succeeded + 1 cancelled
    assert all(client.get_job(i) is None for i in [*done, cancelled])
    assert all(client.get_job(i) is not None for i in [*dead, pending, recent])
    ((orphans,),) = rows(
        dsn,
        "SELECT count(*) FROM {s}.job_events e WHERE NOT EXISTS "
        "(SELECT 1 FROM {s}.jobs j WHERE j.id = e.job_id)",
        schema,
    )
    assert orphans == 0, "pruned jobs take their trail with them"


def test_prune_never_makes_a_claim_wait(dsn: str, schema: str, client: leaseq.Client) -> None:
    """A prune holding locks on a batch of finished rows while claims run with a 50 ms
    lock_timeout: no claim may fail, i.e. no claim ever waited on the prune's locks."""
    client.enqueue_many([{"task": "t"}] * 2000)
    while leases := client.claim(worker="w", limit=500):
        client.complete_many(leases)
    run_sql(dsn, "UPDATE {s}.jobs SET finished_at = now() - interval '10 days'", schema)
    client.enqueue_many([{"task": "t"}] * 200)
    with psycopg.connect(dsn) as pruner, psycopg.connect(dsn, autocommit=True) as claimer:
        # The prune's transaction stays open, holding its row locks, while we claim.
        pruned = pruner.execute(
            client.queries["prune_finished"], {"older_than": 86400, "limit": 5000}
        )
        assert len(pruned.fetchall()) == 2000
        claimer.execute("SET lock_timeout = '50ms'")
        claimed = 0
        while batch := claimer.execute(
            client.queries["claim_jobs"],
            {"queue": "default", "owner": "c", "lease_seconds": 30, "limit": 20},
        ).fetchall():
            claimed += len(batch)
        assert claimed == 200
        pruner.commit()


def test_sql_views_show_history_and_dead_jobs(dsn: str, schema: str, client: leaseq.Client) -> None:
    (job_id,) = _dead_jobs(client, 1, "BROKEN")
    with psycopg.connect(dsn) as conn:
        history = conn.execute(
            sql.SQL("SELECT event, error_code, task FROM {}.job_history WHERE job_id = %s").format(
                sql.Identifier(schema)
            ),
            (job_id,),
        ).fetchall()
        dead = conn.execute(
            sql.SQL("SELECT id, last_error_code, dead_for IS NOT NULL FROM {}.dead_jobs").format(
                sql.Identifier(schema)
            )
        ).fetchall()
    assert history == [("dead", "BROKEN", "t")]
    assert dead == [(job_id, "BROKEN", True)]
