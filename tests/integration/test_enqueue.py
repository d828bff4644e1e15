"""Enqueue: alone, in bulk, and inside the caller's own transaction (with its NOTIFY)."""

from __future__ import annotations

import datetime as dt
import json
import re

import psycopg
import pytest
from psycopg import sql

import leaseq
from leaseq import JobStatus
from leaseq.jobspec import COPY_THRESHOLD
from leaseq.params import notify_channel
from tests.support.helpers import rows


def _listener(dsn: str, schema: str) -> psycopg.Connection[tuple[object, ...]]:
    conn = psycopg.connect(dsn, autocommit=True)
    conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(notify_channel(schema))))
    return conn


def _notifications(conn: psycopg.Connection[tuple[object, ...]], wait: float) -> list[str]:
    return [n.payload for n in conn.notifies(timeout=wait, stop_after=None)]


def test_enqueue_stores_the_seed_columns(client: leaseq.Client, dsn: str, schema: str) -> None:
    job_id = client.enqueue(
        "mail.send", {"to": "a@b.c"}, queue="emails", priority=3, max_attempts=4
    )
    job = client.get_job(job_id)
    assert job is not None
    assert (job.task, job.queue, job.payload, job.priority, job.max_attempts) == (
        "mail.send",
        "emails",
        {"to": "a@b.c"},
        3,
        4,
    )
    assert job.status is JobStatus.PENDING and job.attempt_count == 0 and job.lease_token == 0
    cols = {
        r[0]
        for r in rows(
            dsn,
            "SELECT column_name FROM information_schema.columns "
            "WHERE table_schema = %s AND table_name = 'jobs'",
            schema,
            schema,
        )
    }
    assert {
        "queue_name",
        "payload",
        "status",
        "priority",
        "available_at",
        "attempt_count",
        "max_attempts",
        "lease_owner",
        "lease_token",
        "lease_expires_at",
        "last_error_code",
        "created_at",
        "finished_at",
        "task",
    } <= cols


def test_enqueue_many_returns_ids_in_input_order(client: leaseq.Client) -> None:
    specs = [leaseq.JobSpec("t", {"i": i}, queue=("a" if i % 2 else "b")) for i in range(500)]
    ids = client.enqueue_many(specs)
    assert len(ids) == 500 and ids == sorted(ids)
    for i in (0, 1, 250, 499):
        job = client.get_job(ids[i])
        assert job is not None and job.payload == {"i": i}
    assert client.enqueue_many([]) == []


def test_enqueue_many_with_a_bad_item_stores_nothing(client: leaseq.Client) -> None:
    many = [{"task": "ok", "payload": i} for i in range(500)]  # over COPY_THRESHOLD too
    for bad, says in (
        ({"task": "bad name!"}, "invalid task name"),
        ({"task": "ok", "priorty": 5}, "unknown job option(s): 'priorty'"),
        ({"payload": 1}, "a job needs a task"),
        (("ok", 1), "a job is a JobSpec or a mapping, got tuple"),
        (leaseq.JobSpec("ok", max_attempts=0), "max_attempts must be between"),
    ):
        for jobs in ([{"task": "ok"}, bad], [*many, bad]):
            with pytest.raises(leaseq.ConfigError, match=re.escape(says)):
                client.enqueue_many(jobs)  # type: ignore[arg-type]
    assert client.queue_stats() == []
    spec = leaseq.JobSpec("ok", {"a": 1}, queue="q2", priority=3)
    (job_id,) = client.enqueue_many([spec])
    job = client.get_job(job_id)
    assert job is not None and (job.queue, job.priority, job.payload) == ("q2", 3, {"a": 1})


def test_enqueue_in_rolled_back_transaction_leaves_no_job_and_wakes_nobody(
    client: leaseq.Client, dsn: str, schema: str
) -> None:
    listener = _listener(dsn, schema)
    try:
        with psycopg.connect(dsn) as conn:
            client.enqueue("t", {"x": 1}, connection=conn)
            client.enqueue_many([{"task": "t"}], connection=conn)
            conn.rollback()
        assert _notifications(listener, 0.3) == []
        assert client.queue_stats() == []
    finally:
        listener.close()


def test_enqueue_in_committed_transaction_wakes_after_commit(
    client: leaseq.Client, dsn: str, schema: str
) -> None:
    listener = _listener(dsn, schema)
    try:
        with psycopg.connect(dsn) as conn:
            job_id = client.enqueue("t", queue="emails", connection=conn)
            assert _notifications(listener, 0.2) == [], "NOTIFY must wait for the commit"
            conn.execute("SELECT 1")  # the caller's own work in the same transaction
            conn.commit()
        assert _notifications(listener, 2.0) == ["emails"]
        job = client.get_job(job_id)
        assert job is not None and job.status is JobStatus.PENDING
    finally:
        listener.close()


async def test_async_enqueue_joins_the_callers_transaction(
    aclient: leaseq.AsyncClient, dsn: str
) -> None:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        job_id = await aclient.enqueue("t", connection=conn)
        await conn.rollback()
    assert await aclient.get_job(job_id) is None


def test_scheduled_job_does_not_notify(client: leaseq.Client, dsn: str, schema: str) -> None:
    listener = _listener(dsn, schema)
    try:
        client.enqueue("t", delay=dt.timedelta(hours=1))
        client.enqueue("t", run_at=dt.datetime.now(dt.UTC) + dt.timedelta(hours=1))
        assert _notifications(listener, 0.3) == []
    finally:
        listener.close()


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"task": "has space"}, leaseq.ConfigError),
        ({"task": "x'; DROP TABLE jobs; --"}, leaseq.ConfigError),
        ({"task": ""}, leaseq.ConfigError),
        ({"task": "t" * 129}, leaseq.ConfigError),
        ({"task": "t", "queue": 'quo"te'}, leaseq.ConfigError),
        ({"task": "t", "queue": "ünïcode"}, leaseq.ConfigError),
        ({"task": "t", "priority": 40000}, leaseq.ConfigError),
        ({"task": "t", "priority": -40000}, leaseq.ConfigError),
        ({"task": "t", "priority": True}, leaseq.ConfigError),
        ({"task": "t", "max_attempts": 0}, leaseq.ConfigError),
        ({"task": "t", "delay": -1}, leaseq.ConfigError),
        ({"task": "t", "delay": 1e300}, leaseq.ConfigError),
        ({"task": "t", "delay": float("inf")}, leaseq.ConfigError),
        ({"task": "t", "delay": float("nan")}, leaseq.ConfigError),
        ({"task": "t", "delay": dt.timedelta(days=999_999_999)}, leaseq.ConfigError),
        ({"task": "t", "run_at": dt.datetime(9999, 12, 31, tzinfo=dt.UTC)}, leaseq.ConfigError),
        ({"task": "t", "run_at": dt.datetime(1, 1, 2, tzinfo=dt.UTC)}, leaseq.ConfigError),
        ({"task": "t", "delay": 1, "run_at": dt.datetime.now(dt.UTC)}, leaseq.ConfigError),
        ({"task": "t", "run_at": dt.datetime(2030, 1, 1)}, leaseq.ConfigError),
        ({"task": "t", "payload": {"x": object()}}, leaseq.PayloadError),
        ({"task": "t", "payload": float("nan")}, leaseq.PayloadError),
        ({"task": "t", "payload": "x" * (1024 * 1024 + 1)}, leaseq.PayloadError),
        ({"task": "t", "payload": "nul\x00byte"}, leaseq.PayloadError),
    ],
)
def test_bad_input_gets_a_clear_error_and_stores_nothing(
    client: leaseq.Client, kwargs: dict[str, object], error: type[Exception]
) -> None:
    with pytest.raises(error) as info:
        client.enqueue(**kwargs)  # type: ignore[arg-type]
    message = str(info.value)
    assert message and "\n" not in message
    assert client.queue_stats() == []


@pytest.mark.parametrize("n", [10, COPY_THRESHOLD + 10], ids=["arrays", "copy"])
@pytest.mark.parametrize(
    "bad",
    [
        {"delay": 1e300},
        {"delay": float("inf")},
        {"delay": dt.timedelta(days=999_999_999)},
        {"run_at": dt.datetime(9999, 12, 31, tzinfo=dt.UTC)},
    ],
    ids=["delay-1e300", "delay-inf", "timedelta-huge", "run_at-9999"],
)
def test_an_out_of_range_schedule_in_bulk_stores_nothing(
    client: leaseq.Client, n: int, bad: dict[str, object]
) -> None:
    """Both bulk paths (unnested arrays below COPY_THRESHOLD, COPY from it on) refuse a
    schedule the database (or the COPY path's datetime arithmetic) cannot hold, before
    anything is sent: one line, no job stored."""
    jobs: list[dict[str, object]] = [{"task": "t"} for _ in range(n - 1)]
    jobs.append({"task": "t", **bad})
    with pytest.raises(leaseq.ConfigError) as info:
        client.enqueue_many(jobs)
    assert str(info.value) and "\n" not in str(info.value)
    assert client.queue_stats() == []


def test_the_furthest_schedule_is_accepted(client: leaseq.Client) -> None:
    far = 99 * 365 * 86400.0
    client.enqueue("t", delay=far)
    client.enqueue_many([{"task": "t", "delay": far}] * (COPY_THRESHOLD + 1))
    assert client.queue_stats()[0].scheduled == COPY_THRESHOLD + 2


def test_payload_round_trips_unicode_and_nesting(client: leaseq.Client) -> None:
    payload = {
        "name": "Zoë 🚀",
        "nested": [1, 2.5, None, {"deep": True}],
        "quote": 'it\'s "x"',
        "big": 2**70,  # jsonb numerics are unbounded; the reader must not cap them
        "tiny": -1e-300,
        "escapes": "tab\t nl\n \\ \u2028",
    }
    job_id = client.enqueue("t", payload)
    (lease,) = client.claim(worker="w")
    assert lease.job_id == job_id and lease.payload == payload
    assert json.loads(json.dumps(lease.payload)) == payload


def test_large_batches_go_through_copy_with_the_same_meaning(
    client: leaseq.Client, dsn: str, schema: str
) -> None:
    """From COPY_THRESHOLD jobs on, enqueue_many uses COPY: ids in input order, delays
    from the database clock, one wake-up per ready queue, and the caller's rollback wins."""
    n = COPY_THRESHOLD + 50
    listener = _listener(dsn, schema)
    try:
        specs = [
            leaseq.JobSpec(
                "t",
                {"i": i},
                queue="later" if i % 2 else "now",
                delay=3600 if i % 2 else None,
                priority=i % 3,
                max_attempts=4,
            )
            for i in range(n)
        ]
        ids = client.enqueue_many(specs)
        assert ids == sorted(ids) and len(set(ids)) == n
        assert _notifications(listener, 1.0) == ["now"], "only the ready queue is woken"
        for i in (0, 1, n - 1):
            job = client.get_job(ids[i])
            assert job is not None and job.payload == {"i": i} and job.priority == i % 3
        ((early, late),) = rows(
            dsn,
            "SELECT min(extract(epoch FROM available_at - now())), "
            "max(extract(epoch FROM available_at - now())) "
            "FROM {s}.jobs WHERE queue_name = 'later'",
            schema,
        )
        assert 3500 < float(early) <= float(late) <= 3600
        with psycopg.connect(dsn) as conn:
            client.enqueue_many([{"task": "t"}] * n, connection=conn)
            conn.rollback()
        ((count,),) = rows(dsn, "SELECT count(*) FROM {s}.jobs", schema)
        assert count == n
    finally:
        listener.close()
