# Generated from leaseq/ops/reads_async.py by tools/gen_sync.py. Do not edit by hand:
# change the async source and run `python tools/gen_sync.py`.
"""The read replica's pool: named reads, and nothing else, on the ``read_dsn`` server.

The synchronous twin of ``leaseq/ops/reads_async.py``; see that file for the logic.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any

import psycopg
from psycopg import Connection, Cursor, RawCursor
from psycopg.rows import TupleRow
from psycopg_pool import ConnectionPool

from leaseq.dsn import describe_dsn
from leaseq.errors import DatabaseUnavailable, missing_schema_of, schema_missing
from leaseq.ops.positional import LONG_STATEMENT, positional, values
from leaseq.rows import configure_json, tolerate_extremes
from leaseq.rules.replicas import ReplicaLag, lag_from_row
from leaseq.sql import Queries

Row = tuple[Any, ...]
#: Named reads run together in one transaction: (statement name, parameters).
Reads = Sequence[tuple[str, Mapping[str, Any] | None]]


def run_statement(
    conn: Connection[Any], query: str, params: Mapping[str, Any] | None, tolerant: bool
) -> list[Row]:
    """Run one statement on ``conn``; its rows (none for a statement without a result).
    ``tolerant``: read timestamps out of Python's range as its nearest datetime."""
    args: Mapping[str, Any] | list[Any] | None = params
    if params is not None and len(query) > LONG_STATEMENT:
        # Past psycopg's placeholder cache: positional once, then sent as it is.
        text, names = positional(query)
        cur: Cursor[Any] = RawCursor(conn)
        query, args = text, values(names, params)
    else:
        cur = conn.cursor()
    if tolerant:
        tolerate_extremes(cur)
    try:
        cur.execute(query, args)
    except (psycopg.errors.UndefinedTable, psycopg.errors.InvalidSchemaName) as exc:
        missing = missing_schema_of(exc)
        if missing is None:
            raise
        raise schema_missing(missing) from exc
    return list(cur.fetchall()) if cur.description is not None else []


def _configure_read_only(conn: Connection[Any]) -> None:
    """Every connection of the read pool: jsonb read as the primary pool does, and every
    transaction it opens read-only (psycopg sends ``BEGIN READ ONLY``)."""
    configure_json(conn)
    conn.set_read_only(True)


def unreachable(dsn: str, exc: BaseException) -> DatabaseUnavailable:
    text = str(exc).strip()
    first = text.splitlines()[0] if text else type(exc).__name__
    return DatabaseUnavailable(
        f"cannot connect to the read replica at {describe_dsn(dsn)}: {first}"
    )


class ReadPool:
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
        self._pool: ConnectionPool[Connection[TupleRow]] | None = None
        self._lock = threading.Lock()

    def _get_pool(self) -> ConnectionPool[Connection[TupleRow]]:
        if self._pool is not None:
            return self._pool
        with self._lock:
            if self._pool is None:
                # One direct connection first: an unreachable replica fails now, with the
                # server's own reason, instead of as a pool timeout much later.
                try:
                    probe = Connection.connect(
                        self.dsn, connect_timeout=10, application_name=self._application_name
                    )
                except psycopg.Error as exc:
                    raise unreachable(self.dsn, exc) from None
                probe.close()
                pool = ConnectionPool(
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
                pool.open(wait=True, timeout=30)
                self._pool = pool
        return self._pool

    def rows(
        self, name: str, params: Mapping[str, Any] | None = None, *, tolerant: bool = False
    ) -> list[Row]:
        """One named read, in a read-only transaction of its own."""
        pool = self._get_pool()
        with pool.connection() as conn:
            return run_statement(conn, self._queries[name], params, tolerant)

    def rows_together(self, reads: Reads, *, tolerant: bool = False) -> list[list[Row]]:
        """Named reads in one read-only transaction (so a ``SET LOCAL``-like first read,
        e.g. the dashboard's statement timeout, holds for the others)."""
        pool = self._get_pool()
        with pool.connection() as conn:
            return [
                run_statement(conn, self._queries[name], params, tolerant) for name, params in reads
            ]

    def lag(self, primary_lsn: str) -> ReplicaLag:
        """How far the replica is behind ``primary_lsn`` (the primary's flushed WAL
        position, read just before)."""
        ((row),) = self.rows("replica_lag", {"primary_lsn": primary_lsn})
        return lag_from_row(row)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None
