"""A real Patroni cluster (``tests.support.patroni``: etcd and two PostgreSQL nodes, each run
by Patroni): a worker process and a client on the multi-host DSN follow a switchover and a
hard failover (``kill -9`` of the primary's Patroni, postmaster and backends) without a
restart.

The worker runs with a poll interval of an hour, so after each failover it can find new jobs
only through its LISTEN connection: the listener must have reconnected to the new primary
(its reconnection wakes the worker once, and every later enqueue notifies it).

One cluster serves the module (starting one takes seconds); each test has its own schema.
"""

from __future__ import annotations

import contextlib
import pathlib
import uuid
from collections.abc import Iterator

import psycopg
import pytest

import leaseq
from tests.support.patroni import PatroniCluster
from tests.support.procs import WorkerProcess, wait_for

pytestmark = [
    pytest.mark.slow,
    pytest.mark.requires("postgres-server", "patroni", "etcd"),
    pytest.mark.timeout(400),
]


@pytest.fixture(scope="module")
def cluster() -> Iterator[PatroniCluster]:
    with PatroniCluster() as started:
        yield started


@pytest.fixture()
def schema() -> str:
    return f"pat_{uuid.uuid4().hex[:8]}"


def _succeeded(cluster: PatroniCluster, schema: str) -> int:
    try:
        with psycopg.connect(cluster.multi_host_dsn(), autocommit=True) as conn:
            row = conn.execute(
                f"SELECT count(*) FROM \"{schema}\".jobs WHERE status = 'succeeded'"
            ).fetchone()
    except psycopg.Error:
        return -1  # between primaries
    return int(row[0]) if row else 0


def _port(conn: psycopg.Connection[tuple[object, ...]]) -> int:
    row = conn.execute("SELECT inet_server_port()").fetchone()
    assert row is not None
    return int(str(row[0]))


def test_worker_keeps_draining_across_a_switchover_and_a_hard_failover(
    cluster: PatroniCluster, schema: str, tmp_path: pathlib.Path
) -> None:
    dsn = cluster.multi_host_dsn()
    with leaseq.Client(dsn, schema=schema) as client:
        client.migrate()
        client.enqueue_many([{"task": "noop"}] * 10)
    args = ("--poll-interval", "3600", "--op-timeout", "3", "--queue", "default")
    with WorkerProcess(dsn, schema, *args, log_dir=tmp_path) as worker:
        wait_for(lambda: _succeeded(cluster, schema) == 10, 60, "the first drain")
        done = 10
        for operation in (cluster.switchover, cluster.hard_failover):
            old, new = operation()
            with leaseq.Client(dsn, schema=schema) as client:
                with client.connection() as conn:
                    assert cluster.node_of_port(_port(conn)) == new
                client.enqueue_many([{"task": "noop"}] * 10)
            done += 10
            wait_for(
                lambda want=done: _succeeded(cluster, schema) == want,  # type: ignore[misc]
                90,
                f"the same worker to drain {new} after {operation.__name__} from {old}",
            )
            assert worker.proc.poll() is None, worker.output()


def test_a_client_enqueues_on_the_new_primary_after_a_hard_failover(
    cluster: PatroniCluster, schema: str
) -> None:
    client = leaseq.Client(cluster.multi_host_dsn(), schema=schema, pool_size=4)
    try:
        client.migrate()
        before = client.enqueue("noop")
        with contextlib.ExitStack() as stack:  # several pooled connections to the primary
            for _ in range(4):
                stack.enter_context(client.connection())
        cluster.wait_healthy()
        _old, new = cluster.hard_failover()

        # Every pooled connection died with the old primary. One statement may meet the
        # first of them (its outcome is unknown to the caller: it raises); it discards the
        # whole pool, so the next enqueue connects to the new primary.
        errors = 0
        later: list[int] = []
        for _ in range(5):
            try:
                later.append(client.enqueue("noop"))
            except psycopg.OperationalError:
                errors += 1
        assert errors <= 1, f"{errors} enqueues failed on connections to the dead primary"
        assert len(later) >= 4
        with client.connection() as conn:
            assert cluster.node_of_port(_port(conn)) == new
        assert client.get_job(before) is not None  # replicated before the crash
        assert all(client.get_job(job_id) is not None for job_id in later)
    finally:
        client.close()
