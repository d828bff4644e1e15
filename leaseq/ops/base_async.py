"""The client's plumbing: pool, connections, transactions, the ordering-key lock protocol
and the schema version, under every group of operations (see ``leaseq.ops``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any, Self

import psycopg
from psycopg import AsyncConnection
from psycopg.rows import TupleRow
from psycopg_pool import AsyncConnectionPool

from leaseq import validate
from leaseq.codec import Encryption
from leaseq.dsn import describe_dsn, resolve_dsn, warn_multi_host
from leaseq.errors import DatabaseUnavailable, IsolationLevelError, SchemaError, schema_missing
from leaseq.ops.reads_async import AsyncReadPool, Reads, Row, run_statement
from leaseq.params import notify_channel
from leaseq.payload_store import S3Store, check_offload
from leaseq.redact import Redactor, default_redact
from leaseq.retry import RetryPolicy
from leaseq.rows import configure_json
from leaseq.rules.replicas import ReplicaLag
from leaseq.sql import Queries, check_schema_name, latest_version, migrations
from leaseq.tracing import Tracing

__all__ = ["FAILOVER_SQLSTATES", "AsyncClientBase", "Row"]

#: SQLSTATEs that say "this server is not (or no longer) the writable primary": a demoted
#: or read-only server (25006 read_only_sql_transaction), a server shutting down or crashed
#: (57P01 admin_shutdown, 57P02 crash_shutdown) or still starting (57P03
#: cannot_connect_now). After a failover every pooled connection may point at the old
#: primary, so such an error discards them all: the next statement connects afresh, and a
#: multi-host DSN with target_session_attrs=read-write then finds the new primary.
FAILOVER_SQLSTATES = frozenset({"25006", "57P01", "57P02", "57P03"})


#: The one isolation level leaseq's transactions run at. Its "lock, then decide with a new
#: statement" steps (dependents' promotion, batch callbacks, a unique key's follow-up) rely
#: on each statement taking a new snapshot, and its single statements on READ COMMITTED's
#: re-check of a row changed meanwhile. A server's or role's default_transaction_isolation
#: must not change that: see docs/design.md, "Isolation".
READ_COMMITTED = "read committed"


async def _read_committed(conn: AsyncConnection[Any]) -> None:
    """Every pooled connection runs at READ COMMITTED whatever the server's or the role's
    default: its transactions begin with ISOLATION LEVEL READ COMMITTED (psycopg puts it in
    each BEGIN, so it holds behind a transaction pooler too), and the session default is
    set for its autocommit statements."""
    await conn.set_isolation_level(psycopg.IsolationLevel.READ_COMMITTED)
    await conn.execute(
        "SELECT set_config('default_transaction_isolation', %s, false)", (READ_COMMITTED,)
    )


async def _configure_connection(conn: AsyncConnection[Any]) -> None:
    """Every pooled connection: how jsonb payloads are read, and READ COMMITTED."""
    configure_json(conn)
    await _read_committed(conn)


async def _configure_generic_plans(conn: AsyncConnection[Any]) -> None:
    """A worker's connections: as every pooled one, and prepared statements always run
    their generic plan. Under the default (auto), PostgreSQL re-planned the claim on every
    execution (its generic estimate, with the pause and limit checks' subplans, looked
    dearer than a custom plan): 0.4 ms of planning per claim, about 15% of a raw drain
    (python -m bench: drain-raw 39.6k jobs/s auto, 45.9k with generic plans). leaseq's
    statements are written for their indexes, whatever the parameters.

    And no JIT: the claim's generic plan is costed for an unknown LIMIT over the whole
    table, so once some 30,000 jobs are pending its estimate passes jit_above_cost and every
    claim compiled about 100 functions first: 10-300 ms per claim instead of 1-2 ms (a
    drain of 40,000 jobs went from 16k to 1.5k jobs/s). These statements read a few index
    pages each; compiling never pays."""
    configure_json(conn)
    await _read_committed(conn)
    await conn.execute(
        "SELECT set_config('plan_cache_mode', 'force_generic_plan', false),"
        " set_config('jit', 'off', false)"
    )


class AsyncClientBase:
    """Talks to one leaseq schema. Cheap to create; connects on first use.

    ``dsn`` falls back to ``LEASEQ_DSN`` and then to the embedded PostgreSQL.
    """

    def __init__(
        self,
        dsn: str | None = None,
        *,
        schema: str = "leaseq",
        pool_size: int = 10,
        retry_policy: RetryPolicy | None = None,
        payload_limit: int = validate.DEFAULT_PAYLOAD_LIMIT,
        application_name: str = "leaseq",
        redact: Redactor | None = default_redact,
        prepare: bool = True,
        tracing: Tracing | None = None,
        generic_plans: bool = False,
        read_dsn: str | None = None,
        encryption: Encryption | None = None,
        offload_above: int | None = None,
        payload_store: S3Store | None = None,
    ) -> None:
        """``prepare=False`` turns server-side prepared statements off: needed behind
        PgBouncer in transaction pooling mode (before 1.21), where the next statement of a
        session may reach a server connection that never saw the PREPARE. ``tracing``:
        hooks around enqueues and attempts (see ``leaseq.tracing``; e.g. leaseq[otel]).
        ``generic_plans``: the pool's prepared statements always use their generic plan
        (the worker's claims and fenced writes; see ``_configure_generic_plans``).
        ``read_dsn``: a read replica (a streaming standby) for the inspection reads (jobs,
        events, queue stats, pauses, limits, schedules, the dashboard); writes and the
        reads that must see them stay on ``dsn`` (see ``leaseq.ops.reads_async``).
        ``encryption``: which tasks' payloads, results and effect records are sealed, and
        the keys that seal and open them (``leaseq.codec``, docs/encryption.md).
        ``offload_above``: payloads larger than this many bytes are kept out of the jobs
        table, in ``payload_store`` (None: the ``payloads`` table; or ``leaseq.S3Store``;
        docs/payloads.md)."""
        self.schema = check_schema_name(schema)
        #: Scrubs secrets from error details before they are stored (None: store as is).
        self.redact = redact
        self.queries = Queries(schema)
        self.channel = notify_channel(schema)
        self.retry_policy = retry_policy or RetryPolicy()
        self.payload_limit = validate.check_int("payload_limit", payload_limit, 2, 256 << 20)
        #: Unique-key conflicts this client resolved, by outcome (skip, replace, follow_up,
        #: raise): the source of leaseq_unique_conflicts_total.
        self.unique_conflicts: dict[str, int] = {}
        self._pool_size = validate.check_int("pool_size", pool_size, 1, 1000)
        self._dsn_arg = dsn
        self._dsn: str | None = None
        self._application_name = application_name
        self._prepare = prepare
        self._generic_plans = generic_plans and prepare
        self.tracing = tracing
        self.encryption = encryption
        #: The keys that open sealed values (those of ``encryption``, if any).
        self.keyring = encryption.keyring if encryption is not None else None
        self.offload_above, self.payload_store = check_offload(offload_above, payload_store)
        self._pool: AsyncConnectionPool[AsyncConnection[TupleRow]] | None = None
        self._lock = asyncio.Lock()
        #: Queues whose claim_jobs could not claim (limits it leaves to admit(), or a slot
        #: number still held), and until when (monotonic) their claims take
        #: claim_limited_jobs. Only a cost decision: the limits are the database's either way.
        self._careful_until: dict[str, float] = {}
        #: Queues claim_jobs said are fair (LQ002): claimed with claim_fair_jobs until then.
        self._fair_until: dict[str, float] = {}
        #: The read replica's pool (None: every read runs on the primary). Only ``_read``
        #: and ``_read_together`` use it: write methods have no way to reach it.
        self._reads: AsyncReadPool | None = None
        if read_dsn is not None and read_dsn.strip():
            self._reads = AsyncReadPool(
                read_dsn.strip(),
                self.queries,
                schema=self.schema,
                pool_size=self._pool_size,
                application_name=application_name,
                prepare=prepare,
            )

    # -- connections ------------------------------------------------------------------

    async def dsn(self) -> str:
        """The DSN in use (resolving it, and starting the embedded server, if needed)."""
        if self._dsn is None:
            self._dsn = await asyncio.to_thread(resolve_dsn, self._dsn_arg)
            warn_multi_host(self._dsn)
        return self._dsn

    async def connect(self, **kwargs: Any) -> AsyncConnection[TupleRow]:
        """A new connection of the caller's own (not from the pool), e.g. for LISTEN."""
        dsn = await self.dsn()
        kwargs.setdefault("application_name", self._application_name)
        try:
            return await AsyncConnection.connect(dsn, **kwargs)
        except psycopg.Error as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise DatabaseUnavailable(
                f"cannot connect to PostgreSQL at {describe_dsn(dsn)}: {first}"
            ) from None

    async def _get_pool(self) -> AsyncConnectionPool[AsyncConnection[TupleRow]]:
        if self._pool is not None:
            return self._pool
        async with self._lock:
            if self._pool is None:
                # One direct connection first: a bad DSN fails now with the server's own
                # reason, instead of as a pool timeout much later.
                probe = await self.connect(connect_timeout=10)
                await probe.close()
                pool = AsyncConnectionPool(
                    await self.dsn(),
                    min_size=1,
                    max_size=self._pool_size,
                    kwargs={
                        "autocommit": True,
                        "application_name": self._application_name,
                        # psycopg prepares a statement after 5 runs; None: never.
                        "prepare_threshold": 5 if self._prepare else None,
                    },
                    open=False,
                    name=f"leaseq-{self.schema}",
                    configure=(
                        _configure_generic_plans if self._generic_plans else _configure_connection
                    ),
                )
                try:
                    await pool.open(wait=True, timeout=30)
                except BaseException:
                    # Cancelled (a worker's shutdown stopping a handler's first step) or
                    # timed out mid-open: a half-open pool keeps its worker tasks, which
                    # swallow cancellation, and asyncio.run() never returned. Close it.
                    await pool.close()
                    raise
                self._pool = pool
        return self._pool

    @contextlib.asynccontextmanager
    async def _pooled(self) -> AsyncIterator[AsyncConnection[TupleRow]]:
        """A connection from the pool; after a failover error (``FAILOVER_SQLSTATES``, or a
        connection that broke: a server that died says nothing) it is closed, and the pool's
        other connections are replaced, instead of being handed out again one error each.
        The error itself goes to the caller (a worker counts it as an outage)."""
        pool = await self._get_pool()
        async with pool.connection() as conn:
            try:
                yield conn
            except psycopg.Error as exc:
                if exc.sqlstate in FAILOVER_SQLSTATES or conn.broken:
                    await conn.close()  # a closed connection is dropped when returned
                    await pool.drain()
                raise

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[AsyncConnection[TupleRow]]:
        """A pooled connection for your own statements (autocommit; open a transaction with
        ``conn.transaction()``). Returned to the pool afterwards."""
        async with self._pooled() as conn:
            yield conn

    @contextlib.asynccontextmanager
    async def _transaction(
        self, connection: AsyncConnection[Any] | None = None
    ) -> AsyncIterator[AsyncConnection[Any]]:
        """The caller's connection as it is (their transaction), or a pooled one inside a
        transaction of our own, committed on success."""
        if connection is not None:
            yield connection
            return
        async with self._pooled() as conn, conn.transaction():
            yield conn

    async def _refuse_isolation(self, connection: AsyncConnection[Any] | None) -> None:
        """A caller's connection (``connection=``, ``ctx.complete_in``) must run leaseq's
        statements at READ COMMITTED, as leaseq's own transactions do: at REPEATABLE READ
        or SERIALIZABLE the steps that lock rows and then decide with a new statement see
        a snapshot from before the locks (a fan-in dependent left waiting, a sealed batch
        never fired). Refused with one line, before anything is written."""
        if connection is None:
            return
        ((level,),) = await self._rows("transaction_isolation", None, connection)
        if level != READ_COMMITTED:
            raise IsolationLevelError(
                f"this connection runs at {str(level).upper()}; leaseq needs READ COMMITTED "
                "(set conn.isolation_level = psycopg.IsolationLevel.READ_COMMITTED, or "
                "SET TRANSACTION ISOLATION LEVEL READ COMMITTED first)"
            )

    async def _lock_keys(self, conn: AsyncConnection[Any], keys: Iterable[str | None]) -> list[str]:
        wanted = sorted({k for k in keys if k})
        if wanted:
            await self._rows("lock_keys", {"keys": wanted}, conn)
        return wanted

    async def _promote_keys(self, conn: AsyncConnection[Any], keys: list[str]) -> None:
        if keys:
            await self._rows("promote_keys", {"keys": keys, "channel": self.channel}, conn)

    async def _change_jobs(
        self,
        name: str,
        params: Mapping[str, Any] | Sequence[Mapping[str, Any]],
        keys: Iterable[str | None],
        connection: AsyncConnection[Any] | None = None,
    ) -> list[Row]:
        """Run a statement that changes jobs, once per parameter set given. When ordering
        keys are involved, it runs under their locks, and their heads are re-decided in the
        same transaction."""
        batches = [params] if isinstance(params, Mapping) else list(params)
        keys = [k for k in keys if k]
        if not keys and len(batches) == 1:
            return await self._rows(name, batches[0], connection)
        rows: list[Row] = []
        async with self._transaction(connection) as conn:
            locked = await self._lock_keys(conn, keys) if keys else []
            for batch in batches:
                rows += await self._rows(name, batch, conn)
            await self._promote_keys(conn, locked)
        return rows

    def claims_fair_queues(self) -> bool:
        """Has this client claimed a fair queue lately (claim_fair_jobs, for the while
        claim_jobs' answer holds)? The worker's vacuum of fair_keys looks only then."""
        now = time.monotonic()
        return any(until > now for until in self._fair_until.values())

    def pool_stats(self) -> dict[str, int]:
        """Connections of the pool: in_use, idle, and requests waiting for one."""
        if self._pool is None:
            return {"in_use": 0, "idle": 0, "waiting": 0}
        stats = self._pool.get_stats()
        size, idle = stats.get("pool_size", 0), stats.get("pool_available", 0)
        return {"in_use": size - idle, "idle": idle, "waiting": stats.get("requests_waiting", 0)}

    async def check_connections(self) -> None:
        """Drop idle pooled connections that are broken (after an outage or a terminated
        backend), so the next statement gets a live one."""
        if self._pool is not None:
            await self._pool.check()

    async def close(self) -> None:
        if self._reads is not None:
            await self._reads.close()
        if self._pool is not None:
            await self._pool.close()
            self._pool = None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def _rows(
        self,
        name: str,
        params: Mapping[str, Any] | None = None,
        connection: AsyncConnection[Any] | None = None,
        *,
        tolerant: bool = False,
    ) -> list[Row]:
        """Run one named statement: on the caller's connection (joining its transaction)
        or, without one, on a pooled autocommit connection (its own transaction).
        ``tolerant``: read timestamps out of Python's range as its nearest datetime."""
        query = self.queries[name]
        if connection is not None:
            return await self._execute(connection, query, params, tolerant)
        async with self._pooled() as conn:
            return await self._execute(conn, query, params, tolerant)

    @staticmethod
    async def _execute(
        conn: AsyncConnection[Any], query: str, params: Mapping[str, Any] | None, tolerant: bool
    ) -> list[Row]:
        return await run_statement(conn, query, params, tolerant)

    # -- the read replica -------------------------------------------------------------

    @property
    def read_dsn(self) -> str | None:
        """The read replica's DSN, or None when every read runs on the primary."""
        return self._reads.dsn if self._reads is not None else None

    async def _read(
        self, name: str, params: Mapping[str, Any] | None = None, *, tolerant: bool = False
    ) -> list[Row]:
        """An inspection read: on the read replica when there is one, else as ``_rows``.
        Never for a write, nor for a read that must see this client's own writes."""
        if self._reads is None:
            return await self._rows(name, params, tolerant=tolerant)
        return await self._reads.rows(name, params, tolerant=tolerant)

    async def _read_together(self, reads: Reads, *, tolerant: bool = False) -> list[list[Row]]:
        """Inspection reads in one transaction, on the replica if there is one."""
        if self._reads is not None:
            return await self._reads.rows_together(reads, tolerant=tolerant)
        async with self._transaction() as conn:
            return [
                await self._rows(name, params, conn, tolerant=tolerant) for name, params in reads
            ]

    async def read_replica_lag(self) -> ReplicaLag | None:
        """How far the read replica is behind the primary; None without a ``read_dsn``.
        Reads the primary's flushed WAL position, then the replica's replay position."""
        if self._reads is None:
            return None
        ((lsn,),) = await self._rows("primary_wal_position")
        return await self._reads.lag(str(lsn))

    # -- schema -----------------------------------------------------------------------

    async def migrate(self) -> int:
        """Bring the schema to the version this code knows; returns that version.

        Idempotent, and safe when several processes run it at once: everything happens in
        one transaction under an advisory lock keyed on the schema name.
        """
        q = self.queries
        async with self._pooled() as conn, conn.transaction():
            await conn.execute(q["migrate_lock"], {"key": f"leaseq.migrate.{self.schema}"})
            await conn.execute(q["create_schema"])
            await conn.execute(q["create_version_table"])
            cur = await conn.execute(q["applied_versions"])
            applied = {row[0] for row in await cur.fetchall()}
            self._refuse_newer(max(applied, default=0))
            for migration in migrations(self.schema):
                if migration.version not in applied:
                    await conn.execute(migration.sql.encode())
                    await conn.execute(
                        q["record_version"],
                        {"version": migration.version, "name": migration.name},
                    )
        return latest_version()

    async def schema_version(self) -> int | None:
        """The applied schema version, or None when this schema was never migrated."""
        table = f'"{self.schema}".schema_version'
        exists = await self._rows("version_table_exists", {"table": table})
        if not exists[0][0]:
            return None
        version = (await self._rows("schema_version"))[0][0]
        return int(version) if version is not None else None

    async def check_schema(self) -> int:
        """Raise :class:`SchemaError` unless the schema is exactly at this code's version."""
        version = await self.schema_version()
        if version is None:
            raise schema_missing(self.schema)
        self._refuse_newer(version)
        if version < latest_version():
            raise SchemaError(
                f"schema {self.schema!r} is at version {version}, this leaseq needs "
                f"{latest_version()}; run `leaseq migrate`"
            )
        return version

    def _refuse_newer(self, version: int) -> None:
        if version > latest_version():
            raise SchemaError(
                f"schema {self.schema!r} is at version {version}, newer than this leaseq "
                f"understands ({latest_version()}); upgrade leaseq"
            )
