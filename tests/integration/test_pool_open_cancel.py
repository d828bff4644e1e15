"""A client's first use opens its pool; a cancel in the middle of that open (a worker's
shutdown stopping a handler at its first step, whose record is the handler client's first
statement) must close the half-open pool, or its worker tasks swallow the cancellation and
``asyncio.run`` never returns. The open is held up for real: the pool reaches PostgreSQL
through a fault proxy that stalls once the pool's first connection arrives."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Iterator

import pytest
from psycopg.conninfo import conninfo_to_dict

import leaseq
from tests.support.faults import FaultProxy


@pytest.fixture()
def proxy(dsn: str) -> Iterator[FaultProxy]:
    params = conninfo_to_dict(dsn)
    with FaultProxy(str(params.get("host") or "127.0.0.1"), int(params.get("port") or 5432)) as p:
        yield p


def test_a_cancel_during_the_pool_open_closes_the_pool_and_asyncio_run_returns(
    proxy: FaultProxy, dsn: str, schema: str
) -> None:
    outcome: list[str] = []

    async def scenario() -> str:
        client = leaseq.AsyncClient(proxy.dsn(dsn), schema=schema)
        opening = asyncio.create_task(client._get_pool())
        for _ in range(500):
            if proxy.stalled:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.3)  # the open now waits on a connection that moves nothing
        if opening.done():
            return "opened before the stall"
        opening.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await opening
        return "cancelled, no pool kept" if client._pool is None else "a pool was kept"

    def stall_at_the_pools_connection() -> None:
        deadline = time.monotonic() + 30
        while proxy.accepted < 2 and time.monotonic() < deadline:  # 1: the probe, 2: the pool's
            time.sleep(0.0005)
        proxy.stall()

    staller = threading.Thread(target=stall_at_the_pools_connection, daemon=True)
    runner = threading.Thread(target=lambda: outcome.append(asyncio.run(scenario())), daemon=True)
    staller.start()
    runner.start()
    try:
        runner.join(60)
        assert not runner.is_alive(), "asyncio.run never returned: the half-open pool lived on"
    finally:
        proxy.resume()
    assert outcome == ["cancelled, no pool kept"], outcome
