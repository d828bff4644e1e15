"""The read replica's pool: named reads, and nothing else, on the ``read_dsn`` server.

``Client(dsn, read_dsn=...)`` holds one of these beside its primary pool. Only the client's
inspection reads are given it (``AsyncClientBase._read``: jobs, events, queue stats, pauses,
limits, schedules, waiting jobs, batches, the dashboard's pages); every write, and every
read that must see the caller's own writes (result waits, the ``attempts_ended`` re-read,
migrations, schema checks, the worker's reads), runs on the primary pool. Writes cannot
reach the replica by mistake: this object hands out no connection and runs only named
statements, and each of its transactions is read-only (``BEGIN READ ONLY``, per
transaction, so nothing leaks into a server connection PgBouncer shares in transaction
pooling), so a write sent here fails with SQLSTATE 25006 even when ``read_dsn`` names a
primary.

An unreachable read DSN fails the read (:class:`~leaseq.errors.DatabaseUnavailable`,
naming the read replica); it never falls back to the primary, whose load the replica is
there to spare. Writes go on regardless.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

import psycopg
from psycopg import AsyncConnection, AsyncCursor, AsyncRawCursor
from psycopg.rows import TupleRow
from psycopg_pool import AsyncConnectionPool

from leaseq.dsn import describe_dsn
from leaseq.errors import DatabaseUnavailable, missing_schema_of, schema_missing
from leaseq.ops.positional import LONG_STATEMENT, positional, values
from leaseq.rows import configure_json, tolerate_extremes
from leaseq.rules.replicas import ReplicaLag, lag_from_row
from leaseq.sql import Queries

Row = tuple[Any, ...]
#: Named reads run together in one transaction: (statement name, parameters).
Reads = Sequence[tuple[str, Mapping[str, Any] | None]]


async def run_statement(
    conn: AsyncConnection[Any], query: str, params: Mapping[str, Any] | None, tolerant: bool
) -> list[Row]:
    """Run one statement on ``conn``; its rows (none for a statement without a result).
    ``tolerant``: read timestamps out of Python's range as its nearest datetime."""
    args: Mapping[str, Any] | list[Any] | None = params
    if params is not None and len(query) > LONG_STATEMENT:
        # Past psycopg's placeholder cache: positional once, then sent as it is.
        text, names = positional(query)
        cur: AsyncCursor[Any] = AsyncRawCursor(conn)
        query, args = text, values(names, params)
    else:
        cur = conn.cursor()
    if tolerant:
        tolerate_extremes(cur)
    try:
        await cur.execute(query, args)
    except (psycopg.errors.UndefinedTable, psycopg.errors.InvalidSchemaName) as exc:
        missing = missing_schema_of(exc)
        if missing is None:
            raise
        raise schema_missing(missing) from exc
    return list(await cur.fetchall()) if cur.description is not None else []


async def _configure_read_only(conn: AsyncConnection[Any]) -> None:
    """Every connection of the read pool: jsonb read as the primary pool does, and every
    transaction it opens read-only (psycopg sends ``BEGIN READ ONLY``)."""
    configure_json(conn)
    await conn.set_read_only(True)


def unreachable(dsn: str, exc: BaseException) -> DatabaseUnavailable:
    text = str(exc).strip()
    first = text.splitlines()[0] if text else type(exc).__name__
    return DatabaseUnavailable(
        f"cannot connect to the read replica at {describe_dsn(dsn)}: {first}"
    )


class AsyncReadPool:
    """Named reads on the read replica, in read-only sessions (see the module's text)."""

    def __init__(
        self,
        dsn: str,
        queries: Queries,
        *,
        schema: str,
        pool_size: int,
        application_name: str,
        prepare: bool,
    ) -> None:
        self.dsn = dsn
        self._queries = queries
        self._schema = schema
        self._pool_size = pool_size
        self._application_name = application_name
        self._prepare = prepare
        self._pool: AsyncConnectionPool[AsyncConnection[TupleRow]] | None = None
        self._lock = asyncio.Lock()

    async def _get_pool(self) -> AsyncConnectionPool[AsyncConnection[TupleRow]]:
        if self._pool is not None:
            return self._pool
        async with self._lock:
            if self._pool is None:
                # One direct connection first: an unreachable replica fails now, with the
                # server's own reason, instead of as a pool timeout much later.
                try:
                    probe = await AsyncConnection.connect(
                        self.dsn, connect_timeout=10, application_name=self._application_name
                    )
                except psycopg.Error as exc:
                    raise unreachable(self.dsn, exc) from None
                await probe.close()
                pool = AsyncConnectionPool(
                    self.dsn,
                    min_size=1,
                    max_size=self._pool_size,
                    kwargs={
                        # Not autocommit: each use of a connection is one read-only
                        # transaction, ended (committed) when it goes back to the pool.
                        "autocommit": False,
                        "application_name": self._application_name,
                        "prepare_threshold": 5 if self._prepare else None,
                    },
                    open=False,
                    name=f"leaseq-{self._schema}-reads",
                    configure=_configure_read_only,
                )
                await pool.open(wait=True, timeout=30)
                self._pool = pool
        return self._pool

    async def rows(
        self, name: str, params: Mapping[str, Any] | None = None, *, tolerant: bool = False
    ) -> list[Row]:
        """One named read, in a read-only transaction of its own."""
        pool = await self._get_pool()
        async with pool.connection() as conn:
            return await run_statement(conn, self._queries[name], params, tolerant)

    async def rows_together(self, reads: Reads, *, tolerant: bool = False) -> list[list[Row]]:
        """Named reads in one read-only transaction (so a ``SET LOCAL``-like first read,
        e.g. the dashboard's statement timeout, holds for the others)."""
        pool = await self._get_pool()
        async with pool.connection() as conn:
            return [
                await run_statement(conn, self._queries[name], params, tolerant)
                for name, params in reads
            ]

    async def lag(self, primary_lsn: str) -> ReplicaLag:
        """How far the replica is behind ``primary_lsn`` (the primary's flushed WAL
        position, read just before)."""
        ((row),) = await self.rows("replica_lag", {"primary_lsn": primary_lsn})
        return lag_from_row(row)

    async def close(self) -> None:
        if self._pool is not None:
            await self._pool.close()
            self._pool = None
