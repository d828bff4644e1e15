"""Isolation levels (issue 28, item 3): every leaseq transaction runs at READ COMMITTED
whatever the server's or role's default_transaction_isolation, and a caller's connection
at another level is refused with one line before anything is written.

The boundary: two endings that overlap, the first paused inside its transaction after its
fenced completion while the second completes and commits. At REPEATABLE READ the first's
"lock the dependents, then decide with a new statement" step decided with its first
statement's snapshot (the second still running): a fan-in dependent waited for ever and a
sealed batch never fired; at SERIALIZABLE the first ending failed instead."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

import leaseq
from leaseq import IsolationLevelError, JobStatus, Sig
from tests.support.pausing import PausingClient


@pytest.fixture(params=["repeatable read", "serializable"])
def strict_dsn(request: pytest.FixtureRequest, dsn: str) -> Iterator[str]:
    """A database of its own whose default_transaction_isolation is not READ COMMITTED."""
    name = f"iso_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        conn.execute(
            sql.SQL("ALTER DATABASE {} SET default_transaction_isolation = {}").format(
                sql.Identifier(name), sql.Literal(request.param)
            )
        )
    yield make_conninfo(dsn, dbname=name)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))


def _overlapping_endings(dsn: str, first: leaseq.Lease, second: leaseq.Lease) -> None:
    """``first``'s completion paused inside its transaction, after its fenced statement;
    ``second`` completed and committed meanwhile; then ``first`` goes on."""
    pauser = PausingClient(dsn, pause_after="complete_keyed_jobs")
    done: list[bool] = []
    thread = threading.Thread(target=lambda: done.append(pauser.complete(first)))
    other = leaseq.Client(dsn)
    try:
        thread.start()
        assert pauser.reached.wait(30)
        assert other.complete(second)
    finally:
        pauser.go.set()
        thread.join(30)
        pauser.close()
        other.close()
    assert done == [True]


def test_a_fan_in_dependent_is_promoted_whatever_the_database_default(strict_dsn: str) -> None:
    with leaseq.Client(strict_dsn) as client:
        client.migrate()
        a, b = client.enqueue("t"), client.enqueue("t")
        child = client.enqueue("t", depends_on=[a, b])
        leases = {x.job_id: x for x in client.claim(worker="w", limit=5)}
        assert sorted(leases) == [a, b]
        _overlapping_endings(strict_dsn, leases[a], leases[b])
        assert [x.job_id for x in client.claim(worker="w", limit=5)] == [child]


def test_a_sealed_batch_fires_whatever_the_database_default(strict_dsn: str) -> None:
    with leaseq.Client(strict_dsn) as client:
        client.migrate()
        with client.batch(on_success=Sig("report")) as batch:
            ids = [int(i) for i in batch.enqueue_many([{"task": "t"}, {"task": "t"}])]
        leases = {x.job_id: x for x in client.claim(worker="w", limit=5)}
        assert sorted(leases) == ids
        _overlapping_endings(strict_dsn, leases[ids[0]], leases[ids[1]])
        (callback,) = client.claim(worker="w", limit=5)
        assert callback.task == "report" and callback.payload["succeeded"] == 2


def test_a_caller_connection_at_another_level_is_refused_before_anything_is_written(
    dsn: str, client: leaseq.Client
) -> None:
    count = sql.SQL("SELECT count(*) FROM {}.jobs").format(sql.Identifier(client.schema))
    with psycopg.connect(dsn) as conn:
        conn.isolation_level = psycopg.IsolationLevel.SERIALIZABLE
        with pytest.raises(IsolationLevelError, match="SERIALIZABLE; leaseq needs READ COMM"):
            client.enqueue("t", connection=conn)
        # One line, and the caller's transaction is still usable: nothing was written.
        assert conn.execute(count).fetchone() == (0,)
        conn.rollback()
        job_id = client.enqueue("t")
        (lease,) = client.claim(worker="w")
        conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        with pytest.raises(IsolationLevelError, match="REPEATABLE READ"):
            client.complete(lease, connection=conn)
        with pytest.raises(IsolationLevelError):
            client.enqueue_many([{"task": "t"}], connection=conn)
        conn.rollback()
        job = client.get_job(job_id)
        assert job is not None and job.status is JobStatus.RUNNING
        # At READ COMMITTED the same calls go through, in the caller's transaction.
        conn.isolation_level = psycopg.IsolationLevel.READ_COMMITTED
        assert client.complete(lease, connection=conn)
        conn.commit()
    job = client.get_job(job_id)
    assert job is not None and job.status is JobStatus.SUCCEEDED


def test_a_caller_connection_on_the_database_default_is_checked(strict_dsn: str) -> None:
    """The caller's connection left at the database's default (not READ COMMITTED) is
    refused; set to READ COMMITTED it is accepted."""
    with leaseq.Client(strict_dsn) as client, psycopg.connect(strict_dsn) as conn:
        client.migrate()
        with pytest.raises(IsolationLevelError, match="leaseq needs READ COMMITTED"):
            client.enqueue("t", connection=conn)
        conn.rollback()
        conn.isolation_level = psycopg.IsolationLevel.READ_COMMITTED
        job_id = client.enqueue("t", connection=conn)
        conn.commit()
        assert client.get_job(job_id) is not None
