"""A server that dies says nothing: every pooled connection to it just breaks (no SQLSTATE).
The client must not hand out those dead connections one failed statement at a time: the
first broken one discards the whole pool, as a failover SQLSTATE does (``_pooled``).

The break is real: the pool reaches PostgreSQL through a fault proxy whose connections are
reset at once, as a dead node's would be (tests/acceptance/test_patroni.py does it to a
Patroni primary with kill -9).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

import leaseq
from tests.support.faults import FaultProxy


@pytest.fixture()
def proxy(dsn: str) -> Iterator[FaultProxy]:
    params = conninfo_to_dict(dsn)
    with FaultProxy(str(params.get("host") or "127.0.0.1"), int(params.get("port") or 5432)) as p:
        yield p


def test_one_broken_connection_discards_the_pool_so_only_one_statement_fails(
    proxy: FaultProxy, dsn: str, schema: str
) -> None:
    with leaseq.Client(proxy.dsn(dsn), schema=schema, pool_size=4) as client:
        client.migrate()
        with contextlib.ExitStack() as stack:  # four pooled connections, all idle after
            for _ in range(4):
                stack.enter_context(client.connection())
        assert proxy.drop_all() >= 4  # every one of them is reset, without a message

        failed = 0
        for _ in range(5):
            try:
                client.enqueue("noop")
            except psycopg.OperationalError as exc:
                assert exc.sqlstate is None
                failed += 1
        assert failed == 1, f"{failed} statements met a dead pooled connection"
        assert client.count_jobs("pending") == 4
