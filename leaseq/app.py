"""Applications register task handlers; a task knows its name and enqueue defaults."""

from __future__ import annotations

import asyncio
import datetime as dt
import inspect
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Generic, TypedDict, TypeVar, Unpack, overload

from leaseq import validate as checks
from leaseq.client import Client
from leaseq.client_async import AsyncClient
from leaseq.codec import Encryption, Keyring
from leaseq.errors import ConfigError, PayloadError
from leaseq.jobspec import DEFAULTS, SIG_OPTIONS, EnqueueOptions, unknown_options
from leaseq.payload_store import S3Store, check_offload
from leaseq.redact import Redactor, default_redact
from leaseq.retry import Classifier, ErrorRules, RetryPolicy
from leaseq.routed import RoutedClient
from leaseq.routed_async import AsyncRoutedClient
from leaseq.rules.limits import RateLimit, limit_params, task_limit_key, task_limit_name
from leaseq.rules.schedule_timing import DEFAULT_CATCH_UP_MAX, DEFAULT_GRACE
from leaseq.rules.schedules import ScheduleDef, schedule_def
from leaseq.rules.unique import EnqueueResult
from leaseq.tracing import Tracing
from leaseq.workflows import Sig

if TYPE_CHECKING:
    from leaseq.worker.context import JobContext
    from leaseq.worker.effects import Reconciler

Handler = Callable[["JobContext", Any], Any]
#: A task's payload type, from its handler's annotation: ``Task[P].enqueue`` takes a ``P``
#: (mypy checks ``task.enqueue(payload)`` against the handler; unannotated: ``Any``).
P = TypeVar("P")

#: Renewal policies. ``progress`` (default): a lease is renewed only while the handler has
#: called ``ctx.progress()`` within the last lease length, so a stuck handler loses its job.
#: ``alive``: renewed for as long as the handler runs (bounded only by ``max_runtime``).
RENEW_POLICIES = ("progress", "alive")


class TaskOptions(TypedDict, total=False):
    """The options ``@app.task(...)`` accepts besides ``name`` (see ``App.task`` for what
    each means); their defaults are :data:`TASK_DEFAULTS`, their checks ``Task.__init__``."""

    queue: str
    max_attempts: int
    priority: int
    max_runtime: float | None
    renew: str
    retry: RetryPolicy | None
    errors: ErrorRules | None
    payload_versions: Iterable[int] | None
    validate: Callable[[Any], Any] | None
    reconcile: Mapping[str, Reconciler] | None
    concurrency: int | None
    concurrency_key: str | Callable[[Any], Any] | None
    fairness_key: str | Callable[[Any], Any] | None
    cost: int
    rate_limit: RateLimit | None
    store_result: bool
    result_ttl: float | dt.timedelta
    result_limit: int
    encrypt: bool


#: How long a stored result is kept by default (docs/results.md).
RESULT_TTL = 7 * 86400.0
#: The largest stored result by default, in bytes of JSON.
RESULT_LIMIT = 1 << 20

#: Every task option's default: a job's defaults (queue, priority, attempts) are the
#: job options' own (``leaseq.jobspec``), so a task without options enqueues what a bare
#: ``enqueue`` would.
TASK_DEFAULTS: dict[str, Any] = {
    "queue": DEFAULTS["queue"],
    "max_attempts": DEFAULTS["max_attempts"],
    "priority": DEFAULTS["priority"],
    "max_runtime": None,
    "renew": "progress",
    "retry": None,
    "errors": None,
    "payload_versions": None,
    "validate": None,
    "reconcile": None,
    "concurrency": None,
    "concurrency_key": None,
    "fairness_key": None,
    "cost": DEFAULTS["cost"],
    "rate_limit": None,
    "store_result": False,
    "result_ttl": RESULT_TTL,
    "result_limit": RESULT_LIMIT,
    "encrypt": False,
}


class Task(Generic[P]):
    """A registered handler. Call ``enqueue`` to schedule it; the worker calls the handler
    as ``fn(ctx, payload)`` (sync handlers in a thread, async ones on the event loop)."""

    def __init__(
        self,
        app: App,
        fn: Callable[[JobContext, P], Any],
        *,
        name: str,
        **options: Unpack[TaskOptions],
    ) -> None:
        unknown = options.keys() - TASK_DEFAULTS.keys()
        if unknown:
            raise ConfigError(f"unknown task option(s): {', '.join(sorted(map(repr, unknown)))}")
        o: dict[str, Any] = {**TASK_DEFAULTS, **options}
        self.app = app
        self.fn = fn
        self.name = checks.check_name("task", name)
        self.queue = checks.check_name("queue", o["queue"])
        self.max_attempts = checks.check_max_attempts(o["max_attempts"])
        self.priority = checks.check_priority(o["priority"])
        #: The units its jobs take of every concurrency limit that applies (docs/limits.md).
        self.cost = checks.check_cost(o["cost"])
        max_runtime = o["max_runtime"]
        self.max_runtime = (
            None
            if max_runtime is None
            else checks.check_positive_seconds("max_runtime", max_runtime)
        )
        renew = o["renew"]
        if renew not in RENEW_POLICIES:
            raise ConfigError(f"renew must be one of {', '.join(RENEW_POLICIES)}, got {renew!r}")
        self.renew: str = renew
        self.retry: RetryPolicy | None = o["retry"]
        self.classifier = Classifier.build(o["errors"], app.error_rules)
        payload_versions = o["payload_versions"]
        self.payload_versions = None if payload_versions is None else frozenset(payload_versions)
        if self.payload_versions is not None and not self.payload_versions:
            raise ConfigError(f"task {name!r}: payload_versions must not be empty")
        self.validate: Callable[[Any], Any] | None = o["validate"]
        self.reconcile: dict[str, Reconciler] = dict(o["reconcile"] or {})
        for effect_name, hook in self.reconcile.items():
            checks.check_name("effect", effect_name)
            if not callable(hook):
                raise ConfigError(f"reconcile hook for {effect_name!r} is not callable")
        self.is_async = inspect.iscoroutinefunction(fn)
        concurrency_key = o["concurrency_key"]
        if concurrency_key is not None and not (
            callable(concurrency_key) or isinstance(concurrency_key, str)
        ):
            raise ConfigError(f"task {name!r}: concurrency_key is a payload field or a callable")
        self.concurrency_key: str | Callable[[Any], Any] | None = concurrency_key
        fairness_key = o["fairness_key"]
        if fairness_key is not None and not (
            callable(fairness_key) or isinstance(fairness_key, str)
        ):
            raise ConfigError(f"task {name!r}: fairness_key is a payload field or a callable")
        #: The job's fairness key when the enqueue gives none: a payload field, or computed
        #: from the payload (docs/fairness.md).
        self.fairness_key: str | Callable[[Any], Any] | None = fairness_key
        #: The limit this task declares (set by each worker at start), or None.
        self.limit: tuple[str, int | None, RateLimit | None] | None = None
        concurrency, rate_limit = o["concurrency"], o["rate_limit"]
        if concurrency is not None or rate_limit is not None:
            limit_name = task_limit_name(self.name, keyed=concurrency_key is not None)
            limit_params(limit_name, concurrency, rate_limit, None, None)  # check it now
            self.limit = (limit_name, concurrency, rate_limit)
        elif concurrency_key is not None:
            raise ConfigError(f"task {name!r}: concurrency_key needs concurrency or rate_limit")
        #: The handler's return value is stored by its completion (see docs/results.md).
        self.store_result = bool(o["store_result"])
        result_ttl = o["result_ttl"]
        ttl = result_ttl.total_seconds() if isinstance(result_ttl, dt.timedelta) else result_ttl
        self.result_ttl = checks.check_positive_seconds("result_ttl", ttl, 10 * 365 * 86400.0)
        self.result_limit = checks.check_int("result_limit", o["result_limit"], 2, 256 << 20)
        #: Payloads, results and effect records of this task are sealed (docs/encryption.md).
        self.encrypt = bool(o["encrypt"])
        if self.encrypt and app.keyring is None:
            raise ConfigError(
                f"task {name!r} encrypts but no encryption keys are configured: set "
                "LEASEQ_ENCRYPTION_KEYS or App(encryption_keys=...) (`leaseq keys generate`)"
            )

    def __call__(self, ctx: JobContext, payload: P) -> Any:
        return self.fn(ctx, payload)

    def __repr__(self) -> str:
        return f"<Task {self.name} queue={self.queue}>"

    def _options(self, payload: Any, options: EnqueueOptions) -> dict[str, Any]:
        merged = {"queue": self.queue, "max_attempts": self.max_attempts, "priority": self.priority}
        if self.cost != 1:
            merged["cost"] = self.cost
        if self.payload_versions is not None:
            merged["payload_version"] = max(self.payload_versions)
        if self.concurrency_key is not None and options.get("limit_key") is None:
            key = self.concurrency_key
            value = key(payload) if callable(key) else _field(payload, key)
            merged["limit_key"] = task_limit_key(self.name, value)
        if self.fairness_key is not None and options.get("fairness_key") is None:
            fkey = self.fairness_key
            fvalue = fkey(payload) if callable(fkey) else _field(payload, fkey)
            merged["fairness_key"] = None if fvalue is None else str(fvalue)
        unknown_options(options)
        merged.update(options)
        if self.validate is not None:
            # Refuse at enqueue what the worker would refuse anyway, while the caller is here.
            try:
                self.validate(payload)
            except Exception as exc:
                raise PayloadError(f"invalid payload for task {self.name}: {exc}") from None
        return merged

    def enqueue(self, payload: P | None = None, **options: Unpack[EnqueueOptions]) -> EnqueueResult:
        """Enqueue this task through the app's sync client; options as in ``Client.enqueue``.
        With ``App(queues=...)``, on the database of the job's queue."""
        client: Client | RoutedClient = self.app.router or self.app.client
        return client.enqueue(self.name, payload, **self._options(payload, options))

    async def enqueue_async(
        self, payload: P | None = None, **options: Unpack[EnqueueOptions]
    ) -> EnqueueResult:
        """Enqueue through the app's async client; options as in ``AsyncClient.enqueue``."""
        client: AsyncClient | AsyncRoutedClient = self.app.async_router or self.app.async_client
        return await client.enqueue(self.name, payload, **self._options(payload, options))

    def sig(self, payload: P | None = None, **options: Unpack[EnqueueOptions]) -> Sig:
        """This task with a payload and enqueue options, to enqueue later: a step of
        ``leaseq.chain`` / ``leaseq.group``, or a batch callback (docs/workflows.md)."""
        merged = self._options(payload, options)
        return Sig(self.name, payload, {k: v for k, v in merged.items() if k in SIG_OPTIONS})


def _field(payload: Any, name: str) -> Any:
    if not isinstance(payload, Mapping) or name not in payload:
        raise PayloadError(f"concurrency_key: the payload has no field {name!r}")
    return payload[name]


class App:
    """A set of tasks plus where their jobs live (DSN and schema)."""

    def __init__(
        self,
        dsn: str | None = None,
        *,
        schema: str = "leaseq",
        retry_policy: RetryPolicy | None = None,
        error_rules: ErrorRules | None = None,
        redact: Redactor | None = default_redact,
        prepare: bool = True,
        tracing: Tracing | None = None,
        queues: Mapping[str, str] | None = None,
        encryption_keys: Sequence[str] | None = None,
        encrypt: bool = False,
        offload_above: int | None = None,
        payload_store: S3Store | None = None,
    ) -> None:
        """``error_rules`` map exception types to a failure class (permanent, transient,
        unknown) for every task; a task's own ``errors=`` are consulted first. ``tracing``:
        hooks around enqueues and attempts (``leaseq.tracing``; e.g. leaseq[otel]).
        ``queues``: queues on other databases than ``dsn`` (queue -> DSN): tasks enqueue
        there, and ``leaseq worker`` serves each from its database (``leaseq.rules.routing``).

        ``encryption_keys`` (else ``LEASEQ_ENCRYPTION_KEYS``; newest first): the keys that
        seal and open values at rest; ``encrypt=True`` seals every task's payloads, results
        and effect records, ``@app.task(encrypt=True)`` one task's (docs/encryption.md).
        ``offload_above``: payloads over this many bytes are kept out of the jobs table, in
        ``payload_store`` (default: the ``payloads`` table; or ``leaseq.S3Store``;
        docs/payloads.md)."""
        self._dsn = dsn
        #: Queue -> DSN of the queues that live on another database than ``dsn``.
        self.queue_dsns: dict[str, str] = dict(queues or {})
        self.schema = schema
        self.retry_policy = retry_policy
        Classifier.build(error_rules, None)  # check the rules now, not at the first failure
        self.error_rules = error_rules
        self.redact = redact
        #: The keys of this app's processes (None: none configured): they open whatever is
        #: sealed, whichever task sealed it.
        self.keyring = (
            Keyring(encryption_keys) if encryption_keys is not None else Keyring.from_env()
        )
        self.encrypt_all = bool(encrypt)
        if self.encrypt_all and self.keyring is None:
            raise ConfigError(
                "App(encrypt=True) needs encryption keys: set LEASEQ_ENCRYPTION_KEYS or pass "
                "encryption_keys (`leaseq keys generate`)"
            )
        self.offload_above, self.payload_store = check_offload(offload_above, payload_store)
        #: False behind PgBouncer in transaction pooling mode (see AsyncClient).
        self.prepare = prepare
        self.tracing = tracing
        self.tasks: dict[str, Task[Any]] = {}
        #: Schedules declared with ``schedule()``: name -> (task name, options given).
        self.schedules: dict[str, tuple[str, dict[str, Any]]] = {}
        self._client: Client | None = None
        self._async_client: AsyncClient | None = None
        self._router: RoutedClient | None = None
        self._async_router: AsyncRoutedClient | None = None
        #: The event loop the cached async clients were made on (their pools belong to it).
        self._async_loop: asyncio.AbstractEventLoop | None = None

    @property
    def dsn(self) -> str | None:
        return self._dsn

    @dsn.setter
    def dsn(self, value: str | None) -> None:
        """A new DSN drops the clients made for the old one, so the next enqueue connects
        to the new database (a test pointing the app at its own database, every test)."""
        if value != self._dsn:
            self.close()
        self._dsn = value

    def _encrypts(self, task: str) -> bool:
        """Are this task's values sealed? (Every task's with ``App(encrypt=True)``.)"""
        if self.encrypt_all:
            return True
        found = self.tasks.get(task)
        return found is not None and found.encrypt

    def unique_conflicts(self) -> dict[str, int]:
        """Unique-key conflicts resolved by this app's clients so far, by outcome."""
        total: dict[str, int] = {}
        for client in (self._client, self._async_client):
            for outcome, n in (client.unique_conflicts if client else {}).items():
                total[outcome] = total.get(outcome, 0) + n
        return total

    def client_options(self) -> dict[str, Any]:
        """What every client of this app shares: schema, retry policy, redaction, prepare,
        tracing hooks."""
        return {
            "schema": self.schema,
            "retry_policy": self.retry_policy,
            "redact": self.redact,
            "prepare": self.prepare,
            "tracing": self.tracing,
            "encryption": None
            if self.keyring is None
            else Encryption(self.keyring, tasks=self._encrypts),
            "offload_above": self.offload_above,
            "payload_store": self.payload_store,
        }

    @property
    def client(self) -> Client:
        if self._client is None:
            self._client = Client(self.dsn, **self.client_options())
        return self._client

    def _async_cache_fresh(self) -> None:
        """Async clients belong to the event loop they were made on: on another loop (a
        later ``asyncio.run``, the next async test) the cached ones are dropped (their loop
        has ended, or the pool would be used across loops) and new ones made."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # outside any loop (a look at the client from a test thread): as cached
        if self._async_loop is None:
            self._async_loop = loop  # made outside a loop, or not yet: this loop's now
        elif loop is not self._async_loop:
            self._drop_async()
            self._async_loop = loop

    def _drop_async(self) -> None:
        """Forget the async clients; closed in the background when their loop still runs."""
        stale = [c for c in (self._async_client, self._async_router) if c is not None]
        self._async_client = None
        self._async_router = None
        loop, self._async_loop = self._async_loop, None
        if stale and loop is not None and not loop.is_closed() and loop.is_running():
            for client in stale:
                asyncio.run_coroutine_threadsafe(client.close(), loop)

    @property
    def async_client(self) -> AsyncClient:
        self._async_cache_fresh()
        if self._async_client is None:
            self._async_client = AsyncClient(self.dsn, **self.client_options())
        return self._async_client

    @property
    def router(self) -> RoutedClient | None:
        """With ``queues``: the client that enqueues on each queue's database (else None)."""
        if self.queue_dsns and self._router is None:
            queues = dict(self.queue_dsns)
            self._router = RoutedClient(queues, default=self.dsn, **self.client_options())
        return self._router

    @property
    def async_router(self) -> AsyncRoutedClient | None:
        self._async_cache_fresh()
        if self.queue_dsns and self._async_router is None:
            queues = dict(self.queue_dsns)
            options = self.client_options()
            self._async_router = AsyncRoutedClient(queues, default=self.dsn, **options)
        return self._async_router

    @overload
    def task(self, fn: Callable[[JobContext, P], Any], /) -> Task[P]: ...

    @overload
    def task(
        self, fn: None = None, /, *, name: str | None = None, **options: Unpack[TaskOptions]
    ) -> Callable[[Callable[[JobContext, P], Any]], Task[P]]: ...

    def task(
        self,
        fn: Handler | None = None,
        /,
        *,
        name: str | None = None,
        **options: Unpack[TaskOptions],
    ) -> Task[Any] | Callable[[Handler], Task[Any]]:
        """Register a handler, as ``@app.task`` or ``@app.task(name=..., queue=...)``.

        ``max_runtime`` (seconds) stops an attempt that runs longer, whatever its lease
        renewals; it then fails with ``MAX_RUNTIME_EXCEEDED`` and is retried or dead by the
        retry policy. ``renew`` picks the lease renewal policy (see ``RENEW_POLICIES``).
        ``retry`` overrides the app's retry policy; ``errors`` maps exception types to
        failure classes. ``payload_versions`` lists the payload versions the handler
        accepts (others go dead with ``UNSUPPORTED_PAYLOAD_VERSION``); ``validate`` checks
        or converts the payload before the handler sees it (a failure goes dead with
        ``INVALID_PAYLOAD``; its return value is what the handler gets). ``reconcile`` maps
        effect names to hooks ``(ctx, record) -> "done" | "redo" | "dead"`` that settle an
        effect an earlier attempt left uncertain (see ``JobContext.effect``).

        ``concurrency`` caps how many of the task's jobs run at once over all workers, and
        ``rate_limit`` (a :class:`RateLimit`) how fast they start; with ``concurrency_key``
        (a payload field name, or a callable of the payload, evaluated at enqueue) the caps
        hold per key instead (``key:TASK:VALUE``). Workers store them as limits when they
        start; see docs/limits.md.

        The default name is ``module.function``, so it survives refactors only if the
        function stays put; give ``name=`` for tasks with jobs already in flight.
        """

        def register(func: Handler) -> Task[Any]:
            task_name = name or f"{func.__module__}.{func.__qualname__}"
            if task_name in self.tasks:
                raise ConfigError(f"task {task_name!r} is registered twice")
            task = Task(self, func, name=task_name, **options)
            self.tasks[task_name] = task
            return task

        return register(fn) if fn is not None else register

    def schedule(
        self,
        name: str,
        *,
        task: Task[Any] | str,
        cron: str | None = None,
        every: Any = None,
        payload: Any = None,
        tz: str = "UTC",
        queue: str | None = None,
        priority: int | None = None,
        catch_up: str = "latest",
        catch_up_max: int = DEFAULT_CATCH_UP_MAX,
        grace: float = DEFAULT_GRACE,
        overlap: str = "allow",
        enabled: bool = True,
        cost: int | None = None,
    ) -> None:
        """Declare a periodic schedule: ``task`` is enqueued with ``payload`` at every tick of
        ``cron`` (5 fields, or 6 with a leading seconds field, read in time zone ``tz``) or
        every ``every`` seconds (a number or timedelta, at least 1). Checked now: a bad value
        raises a one-line ConfigError. Workers store the app's schedules when they start
        and tick them (see docs/schedules.md for the catch-up, overlap and DST rules).
        ``queue``, ``priority`` and ``cost`` default to the task's."""
        task_name = task.name if isinstance(task, Task) else task
        if name in self.schedules:
            raise ConfigError(f"schedule {name!r} is declared twice")
        options: dict[str, Any] = {
            "cron": cron,
            "every": every,
            "payload": payload,
            "tz": tz,
            "catch_up": catch_up,
            "catch_up_max": catch_up_max,
            "grace": grace,
            "overlap": overlap,
            "enabled": enabled,
        }
        if queue is not None:
            options["queue"] = queue
        if priority is not None:
            options["priority"] = priority
        if cost is not None:
            options["cost"] = cost
        schedule_def(name, task_name, **options)  # checked now, resolved at worker start
        self.schedules[name] = (task_name, options)

    def schedule_defs(self) -> list[ScheduleDef]:
        """The declared schedules, with queue, priority and attempts from their tasks."""
        found = []
        for name, (task_name, options) in self.schedules.items():
            task = self.tasks.get(task_name)
            defaults: dict[str, Any] = {}
            if task is not None:
                defaults = {
                    "queue": task.queue,
                    "priority": task.priority,
                    "max_attempts": task.max_attempts,
                    "cost": task.cost,
                }
            found.append(schedule_def(name, task_name, **{**defaults, **options}))
        return found

    def close(self) -> None:
        """Close the sync clients and forget the async ones (``aclose`` closes them too);
        the next use makes new ones."""
        if self._client is not None:
            self._client.close()
            self._client = None
        if self._router is not None:
            self._router.close()
            self._router = None
        self._drop_async()

    async def aclose(self) -> None:
        """Close every client of this app, async ones included."""
        for client in (self._async_client, self._async_router):
            if client is not None:
                await client.close()
        self._async_client = None
        self._async_router = None
        self.close()
