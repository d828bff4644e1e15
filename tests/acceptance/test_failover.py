"""Failover on a real primary + standby pair (``tests.support.replication``): what a lost
commit, a promotion and a read-only old primary do to leases, idempotency keys and the
connections of clients and workers.

Each case starts a pair of its own (a few seconds), never the shared test server.
"""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

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
