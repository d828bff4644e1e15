"""Failover on a real primary + standby pair (``tests.support.replication``): what a lost
commit, a promotion and a read-only old primary do to leases, idempotency keys and the
connections of clients and workers.

Each case starts a pair of its own (copies of one template cluster, well under a second on a
RAM-backed scratch directory), never the shared test server.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import pathlib
import time
from collections.abc import Iterator

import psycopg
import pytest

import leaseq
from leaseq.models import Failure
from leaseq.owners import worker_of
from leaseq.params import default_idempotency_key
from leaseq.states import JobStatus
from leaseq.worker.completer import Completer
from leaseq.worker.context import JobContext
from tests.support.procs import WorkerProcess, wait_for
from tests.support.replication import ReplicaPair, server_port

pytestmark = [pytest.mark.slow, pytest.mark.requires("postgres-server")]


@pytest.fixture()
def pair() -> Iterator[ReplicaPair]:
    with ReplicaPair() as started:
        yield started


def test_a_commit_after_the_cut_is_lost_by_the_promoted_standby(pair: ReplicaPair) -> None:
    with psycopg.connect(pair.primary_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (x int)")
        conn.execute("INSERT INTO t VALUES (1)")
    pair.wait_caught_up()
    pair.cut()
    with psycopg.connect(pair.primary_dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO t VALUES (2)")  # committed on the primary only
    pair.crash_primary()
    pair.promote()
    with psycopg.connect(pair.multi_host_dsn(), autocommit=True) as conn:
        assert server_port(conn) == pair.standby_port
        assert conn.execute("SELECT array_agg(x) FROM t").fetchone() == ([1],)


def _statuses(dsn: str, schema: str) -> dict[str, int]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        found = conn.execute(
            f'SELECT status::text, count(*) FROM "{schema}".jobs GROUP BY 1'
        ).fetchall()
    return {str(status): int(count) for status, count in found}


def _managed_switchover(pair: ReplicaPair) -> None:
    """The old primary turns read-only with its sessions still open, then the standby,
    caught up, is promoted: what Patroni or a cloud service does on a switchover."""
    pair.wait_caught_up()
    pair.read_only_primary()
    pair.promote()


def test_read_only_old_primary_connections_are_dropped_and_the_pool_finds_the_new_one(
    pair: ReplicaPair,
) -> None:
    client = leaseq.Client(pair.multi_host_dsn(), schema="ha")
    try:
        client.migrate()
        first = client.enqueue("noop")
        with contextlib.ExitStack() as stack:  # three pooled connections to the old primary
            for _ in range(3):
                conn = stack.enter_context(client.connection())
                assert server_port(conn) == pair.primary_port
        _managed_switchover(pair)

        with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
            client.enqueue("noop")
        # No pooled connection to the read-only server is handed out again: every later
        # write lands on the new primary, which has the job enqueued before the switch.
        later = [client.enqueue("noop") for _ in range(5)]
        with client.connection() as conn:
            assert server_port(conn) == pair.standby_port
        assert client.get_job(first) is not None
        assert all(client.get_job(job_id) is not None for job_id in later)
    finally:
        client.close()


def test_multi_host_dsn_without_read_write_target_warns_once(
    pair: ReplicaPair, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="leaseq.dsn")
    for _ in range(2):
        with leaseq.Client(pair.multi_host_dsn(attrs=None), schema="ha") as client:
            client.migrate()
    assert len([r for r in caplog.records if "target_session_attrs" in r.message]) == 1


@pytest.mark.parametrize("how", ["read_only", "fast_stop"])
def test_worker_follows_a_failover_without_a_restart(
    pair: ReplicaPair, tmp_path: pathlib.Path, how: str
) -> None:
    dsn = pair.multi_host_dsn()
    with leaseq.Client(dsn, schema="ha") as client:
        client.migrate()
        client.enqueue_many([{"task": "noop"}] * 20)
    args = ("--poll-interval", "0.1", "--queue", "default")
    with WorkerProcess(dsn, "ha", *args, log_dir=tmp_path) as worker:
        wait_for(lambda: _statuses(pair.primary_dsn, "ha").get("succeeded") == 20, 30, "drain")
        if how == "read_only":
            _managed_switchover(pair)  # sessions see SQLSTATE 25006 on their next write
        else:
            pair.wait_caught_up()
            pair.stop_primary()  # sessions are ended with SQLSTATE 57P01
            pair.promote()
        with leaseq.Client(dsn, schema="ha") as client:
            client.enqueue_many([{"task": "noop"}] * 20)
        wait_for(
            lambda: _statuses(pair.standby_dsn, "ha").get("succeeded") == 40,
            60,
            "the same worker to drain the new primary",
        )
        assert worker.proc.poll() is None, worker.output()


@pytest.mark.parametrize("outcome", ["success", "failure"])
async def test_completion_cut_while_waiting_for_a_stopped_standby_is_re_read(
    pair: ReplicaPair, outcome: str
) -> None:
    client = leaseq.AsyncClient(pair.primary_dsn, schema="ha")
    try:
        await client.migrate()
        job_id = await client.enqueue("noop")
        [lease] = await client.claim(worker="w", lease_seconds=60)
        pair.synchronous(True)
        pair.stop_standby()  # every commit now waits for a flush that never comes
        completer = Completer(client, op_timeout=0.5)
        flushing = asyncio.create_task(completer.run())
        reported: list[JobStatus | None] = []
        written = lease if outcome == "success" else Failure(lease, "BOOM", True)
        completer.submit(written, deadline=time.monotonic() + 30, on_done=reported.append)
        try:
            async with asyncio.timeout(20):
                while not reported:
                    await asyncio.sleep(0.05)
        finally:
            flushing.cancel()
        # The first try's commit was cut by op_timeout after it was done locally; the
        # retry found the lease gone. The row was re-read, not assumed lost.
        expected = JobStatus.SUCCEEDED if outcome == "success" else JobStatus.PENDING
        assert reported == [expected]
        job = await client.get_job(job_id)
        assert job is not None and job.status == expected
    finally:
        await client.close()


def test_a_claim_lost_in_failover_and_reissued_to_the_same_worker_is_refused(
    pair: ReplicaPair,
) -> None:
    with leaseq.Client(pair.multi_host_dsn(), schema="ha") as client:
        client.migrate()
        job_id = client.enqueue("noop")
        pair.wait_caught_up()
        pair.cut()
        [lost] = client.claim(worker="w", lease_seconds=60)  # on the old primary only
        pair.crash_primary()
        pair.promote()
        client.check_connections()
        [current] = client.claim(worker="w", lease_seconds=60)  # the same worker again

        # The new primary never saw the first claim: the token repeats. The owner does not.
        assert (current.job_id, current.token) == (lost.job_id, lost.token) == (job_id, 1)
        assert lost.owner != current.owner
        assert worker_of(lost.owner) == worker_of(current.owner) == "w"

        # The first execution, still running somewhere, passes no fence.
        assert client.heartbeat(lost) is False
        assert client.effect_start(lost, "charge", "k") is False
        with client.connection() as conn, conn.transaction():
            assert client.complete(lost, connection=conn) is False
        assert client.fail(lost, "boom") is False
        assert client.complete(lost) is False

        assert client.heartbeat(current) is True
        assert client.effect_start(current, "charge", "k") is True
        assert client.complete(current) is True
        job = client.get_job(job_id)
        assert job is not None and job.status == JobStatus.SUCCEEDED


def test_a_job_id_reissued_after_a_lost_enqueue_gets_another_idempotency_key(
    pair: ReplicaPair,
) -> None:
    with leaseq.Client(pair.multi_host_dsn(), schema="ha") as client:
        client.migrate()
        pair.wait_caught_up()
        pair.cut()
        lost_id = client.enqueue("noop")  # committed on the old primary only
        [lost] = client.claim(worker="w")
        pair.crash_primary()
        pair.promote()
        client.check_connections()
        new_id = client.enqueue("noop")
        [new] = client.claim(worker="w")

        assert new_id == lost_id, "the new primary handed out the same id again"
        old_key = JobContext(lost, "w").idempotency_key
        new_key = JobContext(new, "w").idempotency_key
        assert old_key != new_key, "an idempotent API would drop the new job's effect"
        job = client.get_job(new_id)
        assert job is not None
        assert new_key == default_idempotency_key(new_id, job.created_at)
        assert new_key.startswith(f"leaseq-job-{new_id}-")
