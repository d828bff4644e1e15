# Generated from leaseq/client_async.py by tools/gen_sync.py. Do not edit by hand:
# change the async source and run `python tools/gen_sync.py`.
"""Client: the synchronous twin of AsyncClient, with the same methods and meanings.

Generated from ``leaseq/client_async.py``; see that file for the logic.
"""

from __future__ import annotations

import threading
import contextlib
import datetime as dt
import json
import time
from collections.abc import Iterator, Callable, Iterable, Mapping, Sequence
from dataclasses import fields, replace
from types import TracebackType
from typing import Any, Unpack

import psycopg
from psycopg import Connection
from psycopg.rows import TupleRow
from psycopg.types.json import set_json_loads
from psycopg_pool import ConnectionPool

from leaseq import validate
from leaseq.dsn import describe_dsn, resolve_dsn
from leaseq.errors import ConfigError, DatabaseUnavailable, SchemaError
from leaseq.models import (
    BlockedKey,
    EffectRecord,
    Failure,
    Heartbeat,
    Job,
    JobEvent,
    JobFilter,
    JobSpec,
    Lease,
    QueueStats,
    SweepResult,
    effect_from_row,
    event_from_row,
    job_from_row,
    leases_from_rows,
    stats_from_row,
)
from leaseq.redact import Redactor, default_redact
from leaseq.retry import ErrorClass, RetryPolicy
from leaseq.sql import Queries, check_schema_name, latest_version, migrations
from leaseq.states import FailureDecision, JobStatus, decide_failure

Row = tuple[Any, ...]

#: From this many jobs on (without ordering keys), enqueue_many uses COPY.
COPY_THRESHOLD = 200


def notify_channel(schema: str) -> str:
    """The LISTEN/NOTIFY channel of a schema; the payload of each notification is a queue."""
    return f"leaseq.{schema}"


def _fence_arrays(leases: Sequence[Lease]) -> dict[str, list[Any]]:
    return {
        "ids": [lease.job_id for lease in leases],
        "owners": [lease.owner for lease in leases],
        "tokens": [lease.token for lease in leases],
    }


_JSON_DECODER = json.JSONDecoder()


def _json_loads(data: str | bytes) -> Any:
    # psycopg hands json.loads the bytes, which makes it sniff their encoding first: half
    # the cost of reading a small payload. The server always sends UTF-8.
    return _JSON_DECODER.decode(data.decode() if isinstance(data, bytes) else data)


def _configure_connection(conn: Connection[Any]) -> None:
    """Every pooled connection: how jsonb payloads are read."""
    set_json_loads(_json_loads, conn)


def _bigint_array(values: Iterable[int]) -> str:
    """An int8[] literal. psycopg dumps a list at about 0.8 us an element (it picks the
    smallest integer type that fits, element by element); a literal costs a tenth of that,
    and the fenced batch statements send two arrays per batch of jobs."""
    return "{" + ",".join(str(int(v)) for v in values) + "}"


def _fence_groups(leases: Sequence[Lease]) -> list[dict[str, Any]]:
    """Parameters of the ``_owned_by_token`` fence: one owner per group, ids ascending and
    unique, as its binary search needs. A job that one owner holds twice in a batch (a stale
    lease and the current one) goes into a second group, so neither hides the other."""
    groups: dict[tuple[str, int], dict[int, int]] = {}
    for lease in leases:
        round_ = 0
        while lease.job_id in groups.setdefault((lease.owner, round_), {}):
            round_ += 1
        groups[(lease.owner, round_)][lease.job_id] = lease.token
    fences = []
    for (owner, _), tokens in groups.items():
        ids = sorted(tokens)
        fences.append(
            {
                "owner": owner,
                "ids": _bigint_array(ids),
                "tokens": _bigint_array(tokens[i] for i in ids),
            }
        )
    return fences


#: A job's fields and their defaults, as JobSpec declares them (task has none).
_JOB_DEFAULTS = {f.name: f.default for f in fields(JobSpec) if f.name != "task"}


def _job_fields(job: JobSpec | Mapping[str, Any]) -> dict[str, Any]:
    """Every field of one job: a JobSpec's, or a mapping's over the defaults. A mapping is
    not turned into a JobSpec first: for a bulk enqueue that cost as much as the checks."""
    if isinstance(job, JobSpec):
        return vars(job)
    if not isinstance(job, Mapping):
        raise ConfigError(f"a job is a JobSpec or a mapping, got {type(job).__name__}")
    unknown = job.keys() - _JOB_DEFAULTS.keys() - {"task"}
    if unknown:
        raise ConfigError(f"unknown job field(s): {', '.join(sorted(map(repr, unknown)))}")
    if "task" not in job:
        raise ConfigError("a job needs a task")
    return {**_JOB_DEFAULTS, **job}


class Client:
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
    ) -> None:
        """``prepare=False`` turns server-side prepared statements off: needed behind
        PgBouncer in transaction pooling mode (before 1.21), where the next statement of a
        session may reach a server connection that never saw the PREPARE."""
        self.schema = check_schema_name(schema)
        #: Scrubs secrets from error details before they are stored (None: store as is).
        self.redact = redact
        self.queries = Queries(schema)
        self.channel = notify_channel(schema)
        self.retry_policy = retry_policy or RetryPolicy()
        self.payload_limit = validate.check_int("payload_limit", payload_limit, 2, 256 << 20)
        self._pool_size = validate.check_int("pool_size", pool_size, 1, 1000)
        self._dsn_arg = dsn
        self._dsn: str | None = None
        self._application_name = application_name
        self._prepare = prepare
        self._pool: ConnectionPool[Connection[TupleRow]] | None = None
        self._lock = threading.Lock()

    # -- connections ------------------------------------------------------------------

    def dsn(self) -> str:
        """The DSN in use (resolving it, and starting the embedded server, if needed)."""
        if self._dsn is None:
            self._dsn = resolve_dsn(self._dsn_arg)
        return self._dsn

    def connect(self, **kwargs: Any) -> Connection[TupleRow]:
        """A new connection of the caller's own (not from the pool), e.g. for LISTEN."""
        dsn = self.dsn()
        kwargs.setdefault("application_name", self._application_name)
        try:
            return Connection.connect(dsn, **kwargs)
        except psycopg.Error as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise DatabaseUnavailable(
                f"cannot connect to PostgreSQL at {describe_dsn(dsn)}: {first}"
            ) from None

    def _get_pool(self) -> ConnectionPool[Connection[TupleRow]]:
        if self._pool is not None:
            return self._pool
        with self._lock:
            if self._pool is None:
                # One direct connection first: a bad DSN fails now with the server's own
                # reason, instead of as a pool timeout much later.
                probe = self.connect(connect_timeout=10)
                probe.close()
                pool = ConnectionPool(
                    self.dsn(),
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
                    configure=_configure_connection,
                )
                pool.open(wait=True, timeout=30)
                self._pool = pool
        return self._pool

    @contextlib.contextmanager
    def connection(self) -> Iterator[Connection[TupleRow]]:
        """A pooled connection for your own statements (autocommit; open a transaction with
        ``conn.transaction()``). Returned to the pool afterwards."""
        pool = self._get_pool()
        with pool.connection() as conn:
            yield conn

    @contextlib.contextmanager
    def _transaction(
        self, connection: Connection[Any] | None = None
    ) -> Iterator[Connection[Any]]:
        """The caller's connection as it is (their transaction), or a pooled one inside a
        transaction of our own, committed on success."""
        if connection is not None:
            yield connection
            return
        pool = self._get_pool()
        with pool.connection() as conn, conn.transaction():
            yield conn

    def _lock_keys(self, conn: Connection[Any], keys: Iterable[str | None]) -> list[str]:
        wanted = sorted({k for k in keys if k})
        if wanted:
            self._rows("lock_keys", {"keys": wanted}, conn)
        return wanted

    def _promote_keys(self, conn: Connection[Any], keys: list[str]) -> None:
        if keys:
            self._rows("promote_keys", {"keys": keys, "channel": self.channel}, conn)

    def _change_jobs(
        self,
        name: str,
        params: Mapping[str, Any] | Sequence[Mapping[str, Any]],
        keys: Iterable[str | None],
        connection: Connection[Any] | None = None,
    ) -> list[Row]:
        """Run a statement that changes jobs, once per parameter set given. When ordering
        keys are involved, it runs under their locks, and their heads are re-decided in the
        same transaction."""
        batches = [params] if isinstance(params, Mapping) else list(params)
        keys = [k for k in keys if k]
        if not keys and len(batches) == 1:
            return self._rows(name, batches[0], connection)
        rows: list[Row] = []
        with self._transaction(connection) as conn:
            locked = self._lock_keys(conn, keys) if keys else []
            for batch in batches:
                rows += self._rows(name, batch, conn)
            self._promote_keys(conn, locked)
        return rows

    def pool_stats(self) -> dict[str, int]:
        """Connections of the pool: in_use, idle, and requests waiting for one."""
        if self._pool is None:
            return {"in_use": 0, "idle": 0, "waiting": 0}
        stats = self._pool.get_stats()
        size, idle = stats.get("pool_size", 0), stats.get("pool_available", 0)
        return {"in_use": size - idle, "idle": idle, "waiting": stats.get("requests_waiting", 0)}

    def check_connections(self) -> None:
        """Drop idle pooled connections that are broken (after an outage or a terminated
        backend), so the next statement gets a live one."""
        if self._pool is not None:
            self._pool.check()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _rows(
        self,
        name: str,
        params: Mapping[str, Any] | None = None,
        connection: Connection[Any] | None = None,
    ) -> list[Row]:
        """Run one named statement: on the caller's connection (joining its transaction)
        or, without one, on a pooled autocommit connection (its own transaction)."""
        query = self.queries[name]
        if connection is not None:
            cur = connection.cursor()
            cur.execute(query, params)
            return list(cur.fetchall()) if cur.description is not None else []
        pool = self._get_pool()
        with pool.connection() as conn:
            cur2 = conn.execute(query, params)
            return list(cur2.fetchall()) if cur2.description is not None else []

    # -- schema -----------------------------------------------------------------------

    def migrate(self) -> int:
        """Bring the schema to the version this code knows; returns that version.

        Idempotent, and safe when several processes run it at once: everything happens in
        one transaction under an advisory lock keyed on the schema name.
        """
        q = self.queries
        pool = self._get_pool()
        with pool.connection() as conn, conn.transaction():
            conn.execute(q["migrate_lock"], {"key": f"leaseq.migrate.{self.schema}"})
            conn.execute(q["create_schema"])
            conn.execute(q["create_version_table"])
            cur = conn.execute(q["applied_versions"])
            applied = {row[0] for row in cur.fetchall()}
            self._refuse_newer(max(applied, default=0))
            for migration in migrations(self.schema):
                if migration.version not in applied:
                    conn.execute(migration.sql.encode())
                    conn.execute(
                        q["record_version"],
                        {"version": migration.version, "name": migration.name},
                    )
        return latest_version()

    def schema_version(self) -> int | None:
        """The applied schema version, or None when this schema was never migrated."""
        table = f'"{self.schema}".schema_version'
        exists = self._rows("version_table_exists", {"table": table})
        if not exists[0][0]:
            return None
        version = (self._rows("schema_version"))[0][0]
        return int(version) if version is not None else None

    def check_schema(self) -> int:
        """Raise :class:`SchemaError` unless the schema is exactly at this code's version."""
        version = self.schema_version()
        if version is None:
            raise SchemaError(
                f"schema {self.schema!r} is not set up in this database; run `leaseq migrate`"
            )
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

    # -- enqueue ----------------------------------------------------------------------

    def _job_params(self, job: Mapping[str, Any]) -> dict[str, Any]:
        run_at, delay = validate.schedule(job["run_at"], job["delay"])
        return {
            "task": validate.check_name("task", job["task"]),
            "queue": validate.check_name("queue", job["queue"]),
            "payload": validate.encode_payload(job["payload"], self.payload_limit),
            "priority": validate.check_priority(job["priority"]),
            "run_at": run_at,
            "delay": delay,
            "max_attempts": validate.check_max_attempts(job["max_attempts"]),
            "payload_version": validate.check_payload_version(job["payload_version"]),
            "idempotency_key": validate.check_idempotency_key(job["idempotency_key"]),
            "ordering_key": validate.check_ordering_key(job["ordering_key"]),
            "key_policy": validate.check_key_policy(job["key_policy"]),
        }

    def enqueue(
        self,
        task: str,
        payload: Any = None,
        *,
        queue: str = "default",
        priority: int = 0,
        run_at: Any = None,
        delay: Any = None,
        max_attempts: int = 8,
        payload_version: int | None = None,
        idempotency_key: str | None = None,
        ordering_key: str | None = None,
        key_policy: str = "block",
        connection: Connection[Any] | None = None,
    ) -> int:
        """Store one job; returns its id.

        With ``connection`` the insert joins that connection's open transaction: the job
        exists, and workers are woken, only if the caller commits. ``payload_version`` tags
        the payload's schema, for tasks that accept only some versions. ``idempotency_key``
        becomes the job's ``ctx.idempotency_key`` (default: derived from the job id).
        Jobs sharing an ``ordering_key`` run one at a time, in enqueue order; when one ends
        dead, ``key_policy`` says whether its key waits (``block``) or moves on (``skip``).
        """
        params = self._job_params(
            {
                "task": task,
                "payload": payload,
                "queue": queue,
                "priority": priority,
                "run_at": run_at,
                "delay": delay,
                "max_attempts": max_attempts,
                "payload_version": payload_version,
                "idempotency_key": idempotency_key,
                "ordering_key": ordering_key,
                "key_policy": key_policy,
            }
        )
        params["channel"] = self.channel
        if params["ordering_key"] is None:
            del params["ordering_key"]
            rows = self._rows("insert_job", params, connection)
        else:
            with self._transaction(connection) as conn:
                self._lock_keys(conn, [params["ordering_key"]])
                rows = self._rows("insert_keyed_job", params, conn)
        return int(rows[0][0])

    def enqueue_many(
        self,
        jobs: Iterable[JobSpec | Mapping[str, Any]],
        *,
        connection: Connection[Any] | None = None,
    ) -> list[int]:
        """Store many jobs in one statement; returns their ids in input order.

        Each item is a :class:`JobSpec` or a mapping with ``enqueue``'s argument names.
        All are validated before anything is sent, so a bad item stores nothing.
        """
        params_list = [self._job_params(_job_fields(job)) for job in jobs]
        if not params_list:
            return []
        keyed = any(p["ordering_key"] for p in params_list)
        if not keyed and len(params_list) >= COPY_THRESHOLD:
            with self._transaction(connection) as conn:
                return self._copy_jobs(conn, params_list)
        arrays = {
            "queues": [p["queue"] for p in params_list],
            "tasks": [p["task"] for p in params_list],
            "payloads": [p["payload"] for p in params_list],
            "priorities": [p["priority"] for p in params_list],
            "run_ats": [p["run_at"] for p in params_list],
            "delays": [p["delay"] for p in params_list],
            "max_attempts": [p["max_attempts"] for p in params_list],
            "payload_versions": [p["payload_version"] for p in params_list],
            "idempotency_keys": [p["idempotency_key"] for p in params_list],
            "ordering_keys": [p["ordering_key"] for p in params_list],
            "key_policies": [p["key_policy"] for p in params_list],
            "channel": self.channel,
        }
        if not keyed:
            rows = self._rows("insert_jobs", arrays, connection)
        else:
            with self._transaction(connection) as conn:
                self._lock_keys(conn, arrays["ordering_keys"])
                rows = self._rows("insert_jobs", arrays, conn)
        return [int(row[0]) for row in rows]

    def _copy_jobs(
        self, conn: Connection[Any], params_list: list[dict[str, Any]]
    ) -> list[int]:
        """Bulk enqueue through COPY (about 3x an insert of unnested arrays): ids reserved
        first, so they are returned in input order; delays count from the database clock."""
        ready = sorted({p["queue"] for p in params_list if p["run_at"] is None and not p["delay"]})
        params = {"n": len(params_list), "queues": ready, "channel": self.channel}
        ((db_now, ids, _),) = self._rows("reserve_job_ids", params, conn)
        cur = conn.cursor()
        with cur.copy(self.queries["copy_jobs"]) as copy:
            for job_id, p in zip(ids, params_list, strict=True):
                delay = p["delay"]
                available = p["run_at"] or (
                    db_now + dt.timedelta(seconds=delay) if delay else db_now
                )
                copy.write_row(
                    (
                        job_id,
                        p["queue"],
                        p["task"],
                        p["payload"],
                        p["priority"],
                        p["priority"],
                        available,
                        p["max_attempts"],
                        p["payload_version"],
                        p["idempotency_key"],
                    )
                )
        return [int(i) for i in ids]

    # -- the lease lifecycle ------------------------------------------------------------

    def claim(
        self,
        queue: str = "default",
        *,
        worker: str,
        lease_seconds: float = 60,
        limit: int = 1,
    ) -> list[Lease]:
        """Claim up to ``limit`` claimable jobs of ``queue`` in one committed statement."""
        seconds = validate.check_positive_seconds("lease_seconds", lease_seconds)
        params = {
            "queue": validate.check_name("queue", queue),
            "owner": validate.check_worker_id(worker),
            "lease_seconds": seconds,
            "limit": validate.check_int("limit", limit, 1, validate.CLAIM_LIMIT_MAX),
        }
        rows = self._rows("claim_jobs", params)
        leases = leases_from_rows(rows, seconds)
        leases.sort(key=lambda lease: (-lease.priority, lease.job_id))
        return leases

    def heartbeat_many(
        self, leases: Sequence[Lease], *, lease_seconds: float | None = None
    ) -> Heartbeat:
        """Renew several leases in one fenced statement; lost ones are reported, not renewed."""
        if not leases:
            return Heartbeat({}, frozenset(), frozenset())
        seconds = validate.check_positive_seconds(
            "lease_seconds",
            lease_seconds if lease_seconds is not None else max(x.lease_seconds for x in leases),
        )
        rows = []
        for fence in _fence_groups(leases):
            rows += self._rows("heartbeat_jobs", {**fence, "lease_seconds": seconds})
        kept = {(int(row[0]), int(row[1])) for row in rows}
        return Heartbeat(
            renewed={int(row[0]): row[2] for row in rows},
            lost=frozenset((x.job_id, x.token) for x in leases) - kept,
            cancel_requested=frozenset(int(row[0]) for row in rows if row[3]),
        )

    def heartbeat(self, lease: Lease, *, lease_seconds: float | None = None) -> bool:
        """Extend the lease; False means it was lost and nothing changed."""
        result = self.heartbeat_many([lease], lease_seconds=lease_seconds)
        return (lease.job_id, lease.token) not in result.lost

    def complete_many(
        self, leases: Sequence[Lease], *, connection: Connection[Any] | None = None
    ) -> set[int]:
        """Mark jobs succeeded, fenced; returns the ids that were still ours."""
        if not leases:
            return set()
        keys = [lease.ordering_key for lease in leases]
        rows = self._change_jobs("complete_jobs", _fence_groups(leases), keys, connection)
        return {int(row[0]) for row in rows}

    def complete(
        self, lease: Lease, *, connection: Connection[Any] | None = None
    ) -> bool:
        """Mark the job succeeded; False means the lease was lost and nothing changed.

        With ``connection`` the completion joins that connection's transaction, so the
        handler's own writes there commit together with it, or not at all.
        """
        return lease.job_id in self.complete_many([lease], connection=connection)

    def _detail(self, detail: str | None) -> str | None:
        if detail is not None and self.redact is not None:
            detail = self.redact(detail)
        return validate.bound_detail(detail)

    def _decide(self, failure: Failure) -> FailureDecision:
        lease = failure.lease
        policy = failure.policy or self.retry_policy
        elapsed = None
        if lease.claimed_at is not None and lease.created_at is not None:
            waited = (lease.claimed_at - lease.created_at).total_seconds()
            elapsed = waited + (time.monotonic() - lease.claimed_monotonic)
        return decide_failure(
            attempt=lease.attempt,
            max_attempts=lease.max_attempts,
            error_class=failure.effective_class,
            delay=policy.delay(lease.attempt, failure.retry_in),
            unknown_failures=lease.unknown_failures,
            unknown_attempts=policy.unknown_attempts,
            elapsed=elapsed,
            max_elapsed=policy.max_elapsed,
        )

    def fail_many(self, failures: Sequence[Failure]) -> dict[int, JobStatus]:
        """Report failed attempts, fenced; returns each job still ours with its new status."""
        if not failures:
            return {}
        decisions = [self._decide(f) for f in failures]
        params = {
            **_fence_arrays([f.lease for f in failures]),
            "to_statuses": [str(d.to_status) for d in decisions],
            "delays": [d.delay for d in decisions],
            "reasons": [d.reason for d in decisions],
            "codes": [validate.bound_code(f.error_code) for f in failures],
            "classes": [str(f.effective_class) for f in failures],
            "details": [self._detail(f.detail) for f in failures],
        }
        keys = [f.lease.ordering_key for f in failures]
        rows = self._change_jobs("fail_jobs", params, keys)
        return {int(row[0]): JobStatus(row[1]) for row in rows}

    def fail(
        self,
        lease: Lease,
        error_code: str,
        *,
        retryable: bool = True,
        detail: str | None = None,
        retry_in: float | None = None,
        error_class: str | None = None,
    ) -> bool:
        """Record a failed attempt: retry later with back-off, or dead when it cannot help
        (not retryable, or a budget is used up). ``error_class`` (permanent, transient,
        unknown) overrides ``retryable``. False means the lease was lost."""
        if error_class is not None:
            ErrorClass(error_class)  # refuse a typo before anything is written
        failure = Failure(lease, error_code, retryable, detail, retry_in, error_class)
        return lease.job_id in self.fail_many([failure])

    def release_many(self, leases: Sequence[Lease]) -> set[int]:
        """Give unstarted jobs back without charging an attempt; returns the ids released."""
        if not leases:
            return set()
        # A released head goes back in line by id: an earlier job replayed meanwhile goes first.
        keys = [lease.ordering_key for lease in leases]
        rows = self._change_jobs("release_jobs", _fence_arrays(leases), keys)
        return {int(row[0]) for row in rows}

    def release(self, lease: Lease) -> bool:
        """Give an unstarted job back; False means the lease was lost and nothing changed."""
        return lease.job_id in self.release_many([lease])

    def sweep(
        self,
        *,
        batch_size: int = 1000,
        actor: str = "sweeper",
        policies: Mapping[str, RetryPolicy] | None = None,
    ) -> SweepResult:
        """Recover expired leases: retry with back-off, or dead once a budget is used up.

        ``policies`` maps task names to their own retry policies (the client's otherwise).
        Works in batches, each its own short transaction; several sweepers may run at once.
        """
        batch = validate.check_int("batch_size", batch_size, 1, 100_000)
        total = SweepResult()
        pool = self._get_pool()
        while True:
            with pool.connection() as conn, conn.transaction():
                cur = conn.execute(self.queries["lock_expired_leases"], {"limit": batch})
                locked = cur.fetchall()
                if not locked:
                    return total
                full_batch = len(locked) == batch
                wanted = sorted({row[7] for row in locked if row[7]})
                keys: list[str] = []
                if wanted:
                    got = self._rows("try_lock_keys", {"keys": wanted}, conn)
                    keys = [key for key, ok in got if ok]
                    # A key busy elsewhere: leave its jobs for the next sweep.
                    locked = [row for row in locked if not row[7] or row[7] in keys]
                decisions = []
                for _, _, task, attempt, max_attempts, unknown, elapsed, _ in locked:
                    policy = (policies or {}).get(task) or self.retry_policy
                    decisions.append(
                        decide_failure(
                            attempt=attempt,
                            max_attempts=max_attempts,
                            error_class=ErrorClass.TRANSIENT,
                            delay=policy.delay(attempt),
                            unknown_failures=unknown,
                            unknown_attempts=policy.unknown_attempts,
                            elapsed=elapsed,
                            max_elapsed=policy.max_elapsed,
                        )
                    )
                cur = conn.execute(
                    self.queries["expire_leases"],
                    {
                        "ids": [row[0] for row in locked],
                        "tokens": [row[1] for row in locked],
                        "to_statuses": [str(d.to_status) for d in decisions],
                        "delays": [d.delay for d in decisions],
                        "reasons": [d.reason for d in decisions],
                        "actor": actor,
                    },
                )
                done = cur.fetchall()
                self._promote_keys(conn, keys)
            total = total + SweepResult(
                requeued=sum(1 for row in done if row[1] == "pending"),
                dead=sum(1 for row in done if row[1] == "dead"),
                cancelled=sum(1 for row in done if row[1] == "cancelled"),
            )
            if not full_batch:
                return total

    # -- inspection and operator actions ---------------------------------------------------

    def get_job(self, job_id: int) -> Job | None:
        rows = self._rows("get_job", {"id": job_id})
        return job_from_row(rows[0]) if rows else None

    def job_events(self, job_id: int) -> list[JobEvent]:
        """The audit trail of one job, oldest first."""
        return [event_from_row(row) for row in self._rows("job_events", {"id": job_id})]

    @staticmethod
    def _filter(
        statuses: Sequence[str], *, job_id: int | None = None, **filters: Unpack[JobFilter]
    ) -> dict[str, Any]:
        """Parameters of the operator filter shared by listing, replay and purge."""
        unknown = set(filters) - set(JobFilter.__annotations__)
        if unknown:
            raise ConfigError(f"unknown job filter: {', '.join(sorted(unknown))}")
        return {
            "statuses": [str(JobStatus(s)) for s in statuses],
            "id": job_id,
            **{name: filters.get(name) for name in JobFilter.__annotations__},
        }

    def list_jobs(
        self, status: str = "dead", *, limit: int = 100, **filters: Unpack[JobFilter]
    ) -> list[Job]:
        """Jobs in one state, newest first, filtered by queue, task, error code, and age
        (seconds since they finished: ``older_than`` / ``newer_than``)."""
        params = self._filter([status], **filters)
        params["limit"] = validate.check_int("limit", limit, 1, 100_000)
        return [job_from_row(row) for row in self._rows("list_jobs", params)]

    def count_jobs(self, status: str = "dead", **filters: Unpack[JobFilter]) -> int:
        """How many jobs ``list_jobs`` (without a limit) would find: a dry run's count."""
        params = self._filter([status], **filters)
        return int((self._rows("count_jobs", params))[0][0])

    def job_effects(self, job_id: int) -> list[EffectRecord]:
        """The external effects a job declared, with what is known of each."""
        rows = self._rows("job_effects", {"id": job_id})
        return [effect_from_row(row) for row in rows]

    def effect_get(
        self, job_id: int, name: str, key: str, *, connection: Connection[Any] | None = None
    ) -> EffectRecord | None:
        rows = self._rows("effect_get", {"id": job_id, "name": name, "key": key}, connection)
        return effect_from_row(rows[0]) if rows else None

    def effect_start(self, lease: Lease, name: str, key: str) -> bool:
        """Record an effect as started, fenced by the lease; False means the lease is lost."""
        params = {
            "id": lease.job_id,
            "owner": lease.owner,
            "token": lease.token,
            "attempt": lease.attempt,
            "name": name,
            "key": key,
        }
        return bool(self._rows("effect_start", params))

    def effect_finish(
        self,
        lease: Lease,
        name: str,
        key: str,
        *,
        status: str,
        result: Any = None,
        error: str | None = None,
    ) -> bool:
        """Record an effect's outcome (``done`` with a JSON result, or ``failed``)."""
        params = {
            "id": lease.job_id,
            "token": lease.token,
            "name": name,
            "key": key,
            "status": status,
            "result": validate.encode_payload(result, self.payload_limit),
            "error": self._detail(error),
        }
        return bool(self._rows("effect_finish", params))

    def queues_have_work(self, queues: Sequence[str]) -> bool:
        """True while any of ``queues`` has a pending (even if scheduled) or running job."""
        rows = self._rows("queues_have_work", {"queues": list(queues)})
        return bool(rows[0][0])

    def queue_stats(self, *, throughput: bool = False) -> list[QueueStats]:
        """Per-queue health, from partial indexes only. With ``throughput``, also how many
        jobs each queue finished in the last minute (that part scans recent history)."""
        stats = [stats_from_row(row) for row in self._rows("queue_stats")]
        if not throughput:
            return stats
        recent: dict[str, int] = dict(self._rows("recent_throughput", {"seconds": 60.0}))
        known = {s.queue for s in stats}
        stats += [
            QueueStats(queue, 0, 0, 0, 0, 0.0, 0.0, 0) for queue in recent if queue not in known
        ]
        return sorted(
            (replace(s, finished_recently=int(recent.get(s.queue, 0))) for s in stats),
            key=lambda s: s.queue,
        )

    def database_health(self) -> dict[str, Any]:
        """Expired leases awaiting a sweep, lock waits and connections of leaseq processes."""
        ((expired, lock_waits, connections),) = self._rows("database_health")
        return {
            "expired_leases": int(expired),
            "lock_waits": int(lock_waits),
            "connections": dict(connections),
        }

    def cancel(
        self, job_id: int, *, actor: str | None = None, reason: str | None = None
    ) -> bool:
        """Cancel a pending job now, or ask its worker to stop a running one.

        False when the job does not exist or is already finished.
        """
        params = {"id": job_id, "actor": actor, "reason": validate.bound_detail(reason)}
        found = self._rows("job_key", {"id": job_id})
        keys = [found[0][0]] if found else []
        return bool(self._change_jobs("cancel_job", params, keys))

    def blocked_keys(self, *, limit: int = 100) -> list[BlockedKey]:
        """Ordering keys held up by a dead head (policy ``block``), oldest first."""
        rows = self._rows(
            "blocked_keys", {"limit": validate.check_int("limit", limit, 1, 100_000)}
        )
        return [BlockedKey(*row) for row in rows]

    def skip_dead_head(self, job_id: int, *, reason: str, actor: str | None = None) -> bool:
        """Let an ordering key move past its dead head (which stays dead); audited.
        False when the job is not a dead, keyed, not-yet-skipped job."""
        if not isinstance(reason, str) or not reason.strip():
            raise ConfigError("skipping a dead head needs a reason")
        found = self._rows("job_key", {"id": job_id})
        if not found or found[0][0] is None:
            return False
        params = {"id": job_id, "actor": actor, "reason": validate.bound_detail(reason)}
        return bool(self._change_jobs("skip_dead_head", params, [found[0][0]]))

    def age_priorities(self, *, interval: float, batch_size: int = 1000) -> int:
        """Priority aging: raise the priority of jobs claimable for a whole ``interval``
        or more (see the age_priorities statement); returns how many moved up."""
        params = {
            "interval": validate.check_positive_seconds("interval", interval, 86400.0),
            "limit": validate.check_int("batch_size", batch_size, 1, 100_000),
        }
        total = 0
        while moved := len(self._rows("age_priorities", params)):
            total += moved
            if moved < params["limit"]:
                break
        return total

    def replay(
        self,
        job_id: int,
        *,
        reason: str,
        actor: str | None = None,
        allow_cancelled: bool = False,
    ) -> bool:
        """Bring a dead job back to pending under the same id with a fresh attempt budget.

        ``reason`` is required and stored with ``actor`` in the audit trail. False when the
        job does not exist or is not dead (or cancelled, with ``allow_cancelled``).
        """
        statuses = ["dead", "cancelled"] if allow_cancelled else ["dead"]
        params = self._filter(statuses, job_id=job_id)
        return bool(self._replay_batch(params, reason, actor, 1))

    def replay_many(
        self,
        *,
        reason: str,
        actor: str | None = None,
        allow_cancelled: bool = False,
        batch_size: int = 500,
        on_progress: Callable[[int], None] | None = None,
        **filters: Unpack[JobFilter],
    ) -> int:
        """Replay every dead job matching the filter (queue, task, error_code, older_than,
        newer_than), in batches, each its own short transaction; ``on_progress(n)`` after
        each batch. Returns how many were replayed."""
        statuses = ["dead", "cancelled"] if allow_cancelled else ["dead"]
        params = self._filter(statuses, **filters)
        batch = validate.check_int("batch_size", batch_size, 1, 10_000)
        total = 0
        while done := self._replay_batch(params, reason, actor, batch):
            total += done
            if on_progress is not None:
                on_progress(done)
        return total

    def _replay_batch(
        self, params: dict[str, Any], reason: str, actor: str | None, limit: int
    ) -> int:
        if not isinstance(reason, str) or not reason.strip():
            raise ConfigError("replay needs a reason (what was fixed)")
        params = {
            **params,
            "limit": limit,
            "actor": actor,
            "reason": validate.bound_detail(reason),
            "channel": self.channel,
        }
        with self._transaction() as conn:
            candidates = self._rows("replay_candidates", params, conn)
            if not candidates:
                return 0
            keys = self._lock_keys(conn, [key for _, key in candidates])
            params["ids"] = [job_id for job_id, _ in candidates]
            replayed = len(self._rows("replay_jobs", params, conn))
            self._promote_keys(conn, keys)
            return replayed

    def purge_dead(
        self,
        *,
        reason: str,
        actor: str | None = None,
        batch_size: int = 500,
        on_progress: Callable[[int], None] | None = None,
        **filters: Unpack[JobFilter],
    ) -> int:
        """Delete dead jobs matching the filter; each leaves a final ``purged`` event with
        ``actor`` and ``reason``. Returns how many were deleted."""
        if not isinstance(reason, str) or not reason.strip():
            raise ConfigError("purging dead jobs needs a reason")
        params = {
            **self._filter(["dead"], **filters),
            "limit": validate.check_int("batch_size", batch_size, 1, 10_000),
            "actor": actor,
            "reason": validate.bound_detail(reason),
        }
        total = 0
        while done := len(self._rows("purge_jobs", params)):
            total += done
            if on_progress is not None:
                on_progress(done)
        return total

    def prune(
        self,
        *,
        older_than: float,
        batch_size: int = 1000,
        max_batches: int | None = None,
        pause: float = 0.0,
    ) -> int:
        """Retention: delete succeeded and cancelled jobs finished more than ``older_than``
        seconds ago (and their trail), in small batches that never make a claim wait on a
        lock; ``pause`` seconds between batches leaves WAL bandwidth to claims. Dead jobs
        are never pruned (see :meth:`purge_dead`). Returns how many were deleted."""
        params = {
            "older_than": validate.check_positive_seconds(
                "older_than", older_than, 100 * 365 * 86400.0
            ),
            "limit": validate.check_int("batch_size", batch_size, 1, 100_000),
        }
        total = batches = 0
        while max_batches is None or batches < max_batches:
            done = len(self._rows("prune_finished", params))
            total += done
            batches += 1
            if done < params["limit"]:
                break
            if pause > 0:
                time.sleep(pause)
        return total
