"""pgqueuer as a peer: ``python -P -m bench.peers pgqueuer setup|drain`` (see __init__).

Configured as a pgqueuer user would: the schema and the NOTIFY channel through pgqueuer's
own settings (``PGQUEUER_SCHEMA``, what ``pgq --schema`` sets, and ``PGQUEUER_CHANNEL``),
and the worker run the way ``pgq run`` runs it: ``pgqueuer.run(factory, batch_size=B,
max_concurrent_tasks=C, mode=drain)`` on uvloop when it is installed (pgqueuer depends on
it). The factory yields a ``QueueManager`` on one dedicated connection, as pgqueuer's
performance guide advises, through one of its two async drivers:

- ``asyncpg``: ``AsyncpgDriver``, the driver pgqueuer recommends for throughput;
- ``psycopg``: ``PsycopgDriver`` on an autocommit psycopg 3 ``AsyncConnection``, the
  driver family leaseq itself uses.

``setup`` runs ``Queries.install()`` (``pgq install``) and
``Queries.optimize_autovacuum()`` (``pgq autovac``, on pgqueuer's tuning checklist), then
enqueues with the list form of ``Queries.enqueue`` (one ``INSERT ... SELECT FROM
UNNEST`` per chunk). Durability stays pgqueuer's default, ``durable`` (every table
WAL-logged, as leaseq's are).

A finished job is deleted from ``pgqueuer`` and logged in ``pgqueuer_log`` with status
``successful``; the benchmark counts those rows.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections.abc import AsyncIterator, Coroutine, Sequence
from typing import Any

import pgqueuer  # type: ignore[import-not-found,unused-ignore]
import psycopg
from pgqueuer.db import (  # type: ignore[import-not-found,unused-ignore]
    AsyncpgDriver,
    PsycopgDriver,
)
from pgqueuer.domain.settings import (  # type: ignore[import-not-found,unused-ignore]
    db_settings,
)
from pgqueuer.models import Job  # type: ignore[import-not-found,unused-ignore]
from pgqueuer.qm import QueueManager  # type: ignore[import-not-found,unused-ignore]
from pgqueuer.queries import Queries  # type: ignore[import-not-found,unused-ignore]
from pgqueuer.types import QueueExecutionMode  # type: ignore[import-not-found,unused-ignore]
from psycopg.conninfo import conninfo_to_dict

from bench.peers import ENQUEUE_CHUNK, dsn, parse, report

ENTRYPOINT = "noop"
APPLICATION_NAME = "leaseq-bench-pgqueuer"
DRIVERS = ("asyncpg", "psycopg")


def configure(schema: str) -> None:
    """What ``pgq --schema`` does: pgqueuer reads its object names from the environment."""
    os.environ["PGQUEUER_SCHEMA"] = schema
    # NOTIFY channels are database-wide: one per schema, so nothing else is woken.
    os.environ["PGQUEUER_CHANNEL"] = f"{schema}_ch"
    db_settings.cache_clear()


async def connect_psycopg() -> psycopg.AsyncConnection[Any]:
    return await psycopg.AsyncConnection.connect(
        dsn(), autocommit=True, application_name=APPLICATION_NAME
    )


async def connect_asyncpg() -> Any:
    """asyncpg takes URIs but not libpq's ``key=value`` strings: pass those as keywords."""
    import asyncpg  # type: ignore[import-untyped,import-not-found,unused-ignore]

    settings = {"application_name": APPLICATION_NAME}
    text = dsn()
    if text.startswith(("postgresql://", "postgres://")):
        return await asyncpg.connect(text, server_settings=settings)
    params = conninfo_to_dict(text)
    names = {"host": "host", "port": "port", "user": "user", "password": "password"}
    kwargs: dict[str, Any] = {names[k]: v for k, v in params.items() if k in names}
    if "dbname" in params:
        kwargs["database"] = params["dbname"]
    return await asyncpg.connect(server_settings=settings, **kwargs)


@contextlib.asynccontextmanager
async def driver(name: str) -> AsyncIterator[Any]:
    if name == "asyncpg":
        conn = await connect_asyncpg()
        try:
            yield AsyncpgDriver(conn)
        finally:
            await conn.close()
    else:
        async with await connect_psycopg() as pconn:
            yield PsycopgDriver(pconn)


async def setup(jobs: int) -> None:
    async with driver("psycopg") as drv:
        queries = Queries(drv)
        await queries.install()
        await queries.optimize_autovacuum()
        for start in range(0, jobs, ENQUEUE_CHUNK):
            count = min(ENQUEUE_CHUNK, jobs - start)
            await queries.enqueue(
                [ENTRYPOINT] * count,
                [json.dumps({"n": start + i}).encode() for i in range(count)],
                [0] * count,
            )


class Counter:
    def __init__(self) -> None:
        self.processed = 0
        self.last = 0.0  # perf_counter() when the last handler returned

    async def noop(self, job: Job) -> None:
        """The no-op handler; it only counts (the benchmark checks the tables too)."""
        self.processed += 1
        self.last = time.perf_counter()


async def drain(driver_name: str, batch: int, concurrency: int) -> Counter:
    counter = Counter()

    @contextlib.asynccontextmanager
    async def factory() -> AsyncIterator[QueueManager]:
        async with driver(driver_name) as drv:
            qm = QueueManager(Queries(drv))
            qm.entrypoint(ENTRYPOINT)(counter.noop)
            yield qm

    await pgqueuer.run(
        factory,
        batch_size=batch,
        max_concurrent_tasks=concurrency,
        mode=QueueExecutionMode.drain,
    )
    return counter


def run_loop(coro: Coroutine[Any, Any, Counter]) -> Counter:
    """The loop ``pgq run`` uses: uvloop when it is installed, else asyncio's."""
    try:
        import uvloop  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        return asyncio.run(coro)
    result: Counter = uvloop.run(coro)
    return result


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv, "python -m bench.peers pgqueuer", drivers=DRIVERS)
    configure(args.schema)
    if args.command == "setup":
        asyncio.run(setup(args.jobs))
        return 0
    started = time.perf_counter()
    counter = run_loop(drain(args.driver, args.batch, args.concurrency))
    report(counter.processed, time.perf_counter() - started, counter.last - started)
    return 0
