"""Operator calls inside the caller's own transaction (issue 18, item 1): cancel, replay, bulk
replay and key skip join a psycopg connection's open transaction, never commit it, and leave
nothing behind when the caller rolls back."""

from __future__ import annotations

import psycopg
import pytest

import leaseq
from leaseq import JobStatus
from tests.support.helpers import rows


def _dead(client: leaseq.Client, dsn: str, schema: str, **options: object) -> int:
    job_id = client.enqueue("t", {}, max_attempts=1, **options)  # type: ignore[arg-type]
    (lease,) = client.claim(worker="w", limit=1)
    client.fail(lease, "BOOM", retryable=False)
    return int(job_id)


def _status(dsn: str, schema: str, job_id: int) -> str:
    return str(rows(dsn, "SELECT status FROM {s}.jobs WHERE id = %s", schema, job_id)[0][0])


@pytest.mark.parametrize("commit", [True, False], ids=["commit", "rollback"])
def test_cancel_joins_the_callers_transaction(
    client: leaseq.Client, dsn: str, schema: str, commit: bool
) -> None:
    job_id = client.enqueue("t", {})
    with psycopg.connect(dsn) as conn:
        assert client.cancel(job_id, reason="not needed", connection=conn)
        # Not visible outside the caller's transaction until it commits.
        assert _status(dsn, schema, job_id) == "pending"
        conn.commit() if commit else conn.rollback()
    assert _status(dsn, schema, job_id) == ("cancelled" if commit else "pending")
    events = [e.event for e in client.job_events(job_id)]
    assert events == (["cancelled"] if commit else [])


@pytest.mark.parametrize("commit", [True, False], ids=["commit", "rollback"])
def test_replay_joins_the_callers_transaction(
    client: leaseq.Client, dsn: str, schema: str, commit: bool
) -> None:
    job_id = _dead(client, dsn, schema)
    with psycopg.connect(dsn) as conn:
        assert client.replay(job_id, reason="fixed", connection=conn)
        assert _status(dsn, schema, job_id) == "dead"
        conn.commit() if commit else conn.rollback()
    assert _status(dsn, schema, job_id) == ("pending" if commit else "dead")


def test_bulk_replay_and_key_skip_join_the_callers_transaction(
    client: leaseq.Client, dsn: str, schema: str
) -> None:
    first = _dead(client, dsn, schema)
    second = _dead(client, dsn, schema)
    head = _dead(client, dsn, schema, ordering_key="k")
    with psycopg.connect(dsn) as conn:
        replayed = client.replay_many(reason="fixed", task="t", connection=conn)
        assert replayed == 3
        conn.rollback()
        assert client.skip_dead_head(head, reason="moving on", connection=conn)
        conn.rollback()
    assert {_status(dsn, schema, j) for j in (first, second, head)} == {"dead"}
    assert client.get_job(head) is not None
    assert [e.event for e in client.job_events(head)] == ["dead"]


async def test_async_cancel_joins_the_callers_transaction(
    aclient: leaseq.AsyncClient, dsn: str, schema: str
) -> None:
    job_id = await aclient.enqueue("t", {})
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        assert await aclient.cancel(job_id, reason="no", connection=conn)
        await conn.rollback()
    job = await aclient.get_job(job_id)
    assert job is not None and job.status is JobStatus.PENDING
