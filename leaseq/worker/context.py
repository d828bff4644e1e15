"""What a handler gets besides its payload (``JobContext``): who it is running as, the
lease's health, and the doors to effects and fenced transactions (see effects.py)."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from leaseq import validate as checks
from leaseq.codes import ErrorCode
from leaseq.errors import ConfigError
from leaseq.models import JobResult, Lease
from leaseq.rules.schedules import ScheduleTick, parse_tick_key
from leaseq.worker.aborts import JobAborted, LeaseLost, aborted, lease_lost
from leaseq.worker.effects import (
    EffectSite,
    FencedTransaction,
    Reconciler,
    run_effect,
    run_effect_async,
)
from leaseq.worker.recorder import StepRecorder
from leaseq.worker.spawns import (
    ChildFailed,
    run_gather,
    run_gather_async,
    run_spawn,
    run_spawn_async,
    spawn_name,
)
from leaseq.worker.steps import (
    StepBook,
    StepSite,
    StepTransaction,
    check_step_name,
    run_patched,
    run_patched_async,
    run_step,
    run_step_async,
)
from leaseq.worker.waits import (
    WaitTimeout,
    run_sleep,
    run_sleep_async,
    run_wait,
    run_wait_async,
    sleep_name,
    until_epoch,
)

if TYPE_CHECKING:
    from leaseq.client import Client
    from leaseq.client_async import AsyncClient

__all__ = ["ChildFailed", "JobAborted", "JobContext", "JobServices", "LeaseLost", "WaitTimeout"]


@dataclass
class JobServices:
    """What a context needs from its worker for effects and fenced transactions: a sync
    client (made on first use, for sync handlers), the async client, reconcile hooks."""

    sync_client: Callable[[], Client] | None
    async_client: AsyncClient | None
    reconcilers: dict[str, Reconciler] = field(default_factory=dict)
    #: The worker's group commit of step records (leaseq/worker/recorder.py), if any.
    recorder: StepRecorder | None = None


class JobContext:
    """Per-attempt context passed to every handler as its first argument.

    ``idempotency_key`` is stable across every attempt of the job: send it to external
    systems (e.g. as an ``Idempotency-Key`` header) so a retried attempt cannot act twice.
    ``fencing_token`` grows with every claim; a system that remembers the highest token it
    has seen can refuse a stale worker's late write.

    Thread-safe: a sync handler calls :meth:`progress` from its thread while the worker's
    event loop reads and aborts.
    """

    __slots__ = (
        "_abort",
        "_completed",
        "_completion_pending",
        "_deadline",
        "_last_progress",
        "_services",
        "_step_book",
        "_suspended",
        "lease",
        "progress_note",
        "worker_id",
    )

    def __init__(self, lease: Lease, worker_id: str, services: JobServices | None = None) -> None:
        self.lease = lease
        self.worker_id = worker_id
        self.progress_note: Any = None
        self._services = services
        self._completed = False
        self._completion_pending = False
        self._last_progress = time.monotonic()
        # Written once by the event loop, read by the handler's thread: a plain attribute
        # is enough (one reference assignment), and costs nothing per job.
        self._abort: str | None = None
        self._step_book: StepBook | None = None  # made on first use: most jobs have no steps
        self._deadline: Callable[[Lease], float] | None = None
        self._suspended = False

    @property
    def _steps(self) -> StepBook:
        book = self._step_book
        if book is None:
            book = self._step_book = StepBook()
        return book

    def __repr__(self) -> str:
        return f"<JobContext job={self.job_id} token={self.fencing_token} attempt={self.attempt}>"

    @property
    def job_id(self) -> int:
        return self.lease.job_id

    @property
    def attempt(self) -> int:
        return self.lease.attempt

    @property
    def fencing_token(self) -> int:
        return self.lease.token

    @property
    def idempotency_key(self) -> str:
        """Stable across every attempt of this job: the key given at enqueue, else
        ``leaseq-job-<id>-<created_at in UTC microseconds>`` (never repeated, even when a
        failover makes an id repeat). Send it as e.g. an ``Idempotency-Key`` header."""
        return self.lease.idempotency_key or f"leaseq-job-{self.lease.job_id}"

    @property
    def schedule(self) -> ScheduleTick | None:
        """The schedule tick this job was enqueued for (name, ``scheduled_for`` as a UTC
        instant, ``catch_up``, ``manual``), read from its idempotency key; None for a job
        no schedule made."""
        return parse_tick_key(self.lease.idempotency_key)

    def effect_key(self, name: str, key: str | None = None) -> str:
        """Idempotency key of one named effect of this job (stable across attempts)."""
        return f"{self.idempotency_key}:{name}" + (f":{key}" if key else "")

    @property
    def task(self) -> str:
        return self.lease.task

    @property
    def queue(self) -> str:
        return self.lease.queue

    @property
    def lease_lost(self) -> bool:
        """True once the lease is known to be gone; the result will not be reported."""
        return self._abort == ErrorCode.LEASE_LOST

    @property
    def aborted(self) -> str | None:
        """Why the worker gave up on this attempt (see :class:`JobAborted`), or None."""
        return self._abort

    @property
    def cancel_requested(self) -> bool:
        return self._abort == ErrorCode.CANCELLED

    def progress(self, note: Any = None) -> None:
        """Report progress. Under the default renewal policy the lease is renewed only while
        the handler reports progress at least once per lease length.

        Raises :class:`LeaseLost` (or :class:`JobAborted`) once the worker gave up on this
        attempt, so a sync handler stops at its next checkpoint instead of working for
        nothing.
        """
        reason = self._abort
        if reason is not None:
            raise aborted(self.lease, reason)
        self._last_progress = time.monotonic()
        self.progress_note = note

    @property
    def last_progress(self) -> float:
        """``time.monotonic()`` of the last progress report (or of the start)."""
        return self._last_progress

    def abort(self, reason: str) -> bool:
        """Mark the attempt abandoned; False if it already was (the first reason wins)."""
        if self._abort is not None:
            return False
        self._abort = reason
        return True

    def watch_deadline(self, deadline_of: Callable[[Lease], float]) -> None:
        """Give the context where to read its lease's local deadline (``time.monotonic()``,
        kept by the worker's lease keeper; 0 once the attempt left the worker): a step never
        starts past it. One function for every attempt, so nothing is made per job."""
        self._deadline = deadline_of

    def _step_site(self) -> StepSite:
        deadline = None if self._deadline is None else self._deadline(self.lease)
        recorder = None if self._services is None else self._services.recorder
        return StepSite(
            self.lease,
            self._steps,
            self.abort,
            self._abort,
            deadline,
            self._mark_suspended,
            recorder,
        )

    def _mark_suspended(self) -> None:
        self._suspended = True

    @property
    def suspended(self) -> bool:
        """True once a durable wait suspended the job: its lease is given back, and the
        worker reports nothing for this run."""
        return self._suspended

    def mark_started(self) -> None:
        self._last_progress = time.monotonic()

    # -- side effects (see leaseq/worker/effects.py) ------------------------------------

    @property
    def completed(self) -> bool:
        """True once a fenced transaction committed the job's completion."""
        return self._completed

    def mark_completed(self) -> None:
        self._completed = True

    @property
    def completion_pending(self) -> bool:
        """True after :meth:`complete_in`: the completion waits in the caller's transaction."""
        return self._completion_pending

    def complete_in(self, connection: Any) -> None:
        """Join this job's fenced completion to *your* open transaction on ``connection``
        (a sync psycopg connection, e.g. the one under a SQLAlchemy session); commit it
        yourself. Raises :class:`LeaseLost` (roll back!) if the lease is gone. After the
        handler returns, the worker checks the commit really happened; if not, the attempt
        is reported failed (``COMPLETION_NOT_COMMITTED``) and retried."""
        services = self._require_services()
        if services.sync_client is None:
            raise ConfigError("use `await ctx.complete_in_async(conn)` in an async handler")
        self._joined(services.sync_client().complete(self.lease, connection=connection))

    async def complete_in_async(self, connection: Any) -> None:
        """:meth:`complete_in` for async handlers (an async psycopg connection)."""
        services = self._require_services()
        if services.async_client is None:
            raise ConfigError("use `ctx.complete_in(conn)` in a sync handler")
        self._joined(await services.async_client.complete(self.lease, connection=connection))

    def _joined(self, ok: bool) -> None:
        if not ok:
            self.abort(ErrorCode.LEASE_LOST)
            raise lease_lost(self.lease)
        self._completion_pending = True

    def _site(self, name: str, key: str | None) -> EffectSite:
        checks.check_name("effect", name)
        if key is not None and (not isinstance(key, str) or len(key) > 200):
            raise ConfigError(f"effect key must be a string of at most 200 characters: {key!r}")
        services = self._require_services()
        return EffectSite(self, name, key or "", services.reconcilers.get(name))

    def _require_services(self) -> JobServices:
        if self._services is None:
            raise ConfigError("this JobContext is not attached to a worker")
        return self._services

    def effect(self, name: str, fn: Callable[[str], Any], *, key: str | None = None) -> Any:
        """Perform an external effect at most once per job, as far as leaseq can tell
        (sync handlers). ``fn(idempotency_key)`` makes the call and returns its result.

        Recorded *started* before ``fn`` runs (only while the lease holds) and *done* after.
        If an earlier attempt started it but never recorded it done, the outcome is
        uncertain: the task's reconcile hook for ``name`` decides (done / redo / dead);
        without a hook the job stops as dead with ``UNCERTAIN_EFFECT``.
        """
        services = self._require_services()
        if services.sync_client is None:
            raise ConfigError("use `await ctx.effect_async(...)` in an async handler")
        return run_effect(self._site(name, key), services.sync_client(), fn)

    async def effect_async(
        self, name: str, fn: Callable[[str], Any], *, key: str | None = None
    ) -> Any:
        """:meth:`effect` for async handlers; ``fn`` may return an awaitable."""
        services = self._require_services()
        if services.async_client is None:
            raise ConfigError("use `ctx.effect(...)` in a sync handler")
        return await run_effect_async(self._site(name, key), services.async_client, fn)

    def dependency_results(self) -> dict[int, JobResult]:
        """The outcome of each of this job's dependencies, by job id: status and stored
        value (tasks with store_result=True), or the last failure of one that ended dead or
        cancelled under on_dead "run" ("ignore" leaves such a dependency out). Sync
        handlers; async ones use :meth:`dependency_results_async`."""
        services = self._require_services()
        if services.sync_client is None:
            raise ConfigError("use `await ctx.dependency_results_async()` in an async handler")
        return services.sync_client().dependency_results(self.job_id)

    async def dependency_results_async(self) -> dict[int, JobResult]:
        """:meth:`dependency_results` for async handlers."""
        services = self._require_services()
        if services.async_client is None:
            raise ConfigError("use `ctx.dependency_results()` in a sync handler")
        return await services.async_client.dependency_results(self.job_id)

    def transaction(self) -> FencedTransaction | StepTransaction:
        """A transaction whose commit includes this job's fenced completion; see
        :class:`leaseq.worker.effects.FencedTransaction`. Inside a step, one that commits
        with the step's record instead (:class:`leaseq.worker.steps.StepTransaction`)."""
        services = self._require_services()
        active = self._steps.active
        if active is not None:
            return StepTransaction(active, services.sync_client, services.async_client)
        return FencedTransaction(self, services.sync_client, services.async_client)

    # -- durable steps (see leaseq/worker/steps.py) -------------------------------------

    def step_key(self, name: str) -> str:
        """Idempotency key of step ``name`` of this job (stable across attempts): give it
        to an external system called inside the step."""
        return f"{self.idempotency_key}:step:{check_step_name(name)}"

    def step(self, name: str, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn(*args)`` once per job (sync handlers): its JSON result is recorded
        under the lease's fence and returned from the record on every later attempt.
        Writes made through ``ctx.transaction()`` inside ``fn`` commit with the record.
        Raises :class:`LeaseLost` when the lease ended before the record committed (the
        step then runs again on the job's next attempt)."""
        services = self._require_services()
        if services.sync_client is None:
            raise ConfigError("use `await ctx.step_async(...)` in an async handler")
        site = self._step_site()
        return run_step(site, services.sync_client(), check_step_name(name), fn, args)

    async def step_async(self, name: str, fn: Callable[..., Any], *args: Any) -> Any:
        """:meth:`step` for async handlers; ``fn`` may be sync or async."""
        services = self._require_services()
        if services.async_client is None:
            raise ConfigError("use `ctx.step(...)` in a sync handler")
        site = self._step_site()
        return await run_step_async(site, services.async_client, check_step_name(name), fn, args)

    # -- durable sleep and signals (see leaseq/worker/waits.py) -------------------------

    def _sync(self) -> Client:
        services = self._require_services()
        if services.sync_client is None:
            raise ConfigError("use the *_async spelling (await ctx...) in an async handler")
        return services.sync_client()

    def _async(self) -> AsyncClient:
        services = self._require_services()
        if services.async_client is None:
            raise ConfigError("use the spelling without _async in a sync handler")
        return services.async_client

    def sleep(self, seconds: float, *, name: str | None = None) -> None:
        """Sleep durably (sync handlers): the first time, the wake-up time is fixed at now
        + ``seconds`` (database clock) and the job is suspended — its lease, limit slots
        and connection given back, the attempt not charged — until then; the handler then
        runs again from the start, its finished steps answered from their records, and
        goes on past this sleep. A step named ``name`` (default ``sleep-N``, N its place).
        Raises :class:`JobSuspended` to stop the handler: let it propagate."""
        seconds = checks.check_positive_seconds("seconds", seconds, 1e9)
        site = self._step_site()
        run_sleep(site, self._sync(), sleep_name(site, name), seconds=seconds, until=None)

    async def sleep_async(self, seconds: float, *, name: str | None = None) -> None:
        """:meth:`sleep` for async handlers."""
        seconds = checks.check_positive_seconds("seconds", seconds, 1e9)
        site = self._step_site()
        name = sleep_name(site, name)
        await run_sleep_async(site, self._async(), name, seconds=seconds, until=None)

    def sleep_until(self, when: dt.datetime, *, name: str | None = None) -> None:
        """:meth:`sleep` until an aware datetime (a time in the past goes on at once)."""
        site = self._step_site()
        run_sleep(site, self._sync(), sleep_name(site, name), seconds=None, until=until_epoch(when))

    async def sleep_until_async(self, when: dt.datetime, *, name: str | None = None) -> None:
        """:meth:`sleep_until` for async handlers."""
        site = self._step_site()
        name = sleep_name(site, name)
        await run_sleep_async(site, self._async(), name, seconds=None, until=until_epoch(when))

    def wait_for(self, signal: str, *, timeout: float | None = None) -> Any:
        """Wait durably for ``signal`` (sync handlers; sent by ``client.signal``) and return
        its payload. A signal sent before the wait is found at once; otherwise the job is
        suspended (as by :meth:`sleep`) until the signal comes or ``timeout`` seconds
        (fixed the first time) pass, which raises :class:`WaitTimeout`. The delivery is
        recorded in the step ``wait:<signal>``: exactly once, and every rerun gets it."""
        name = checks.check_signal_name(signal)
        if timeout is not None:
            timeout = checks.check_positive_seconds("timeout", timeout, 1e9)
        return run_wait(self._step_site(), self._sync(), name, timeout)

    async def wait_for_async(self, signal: str, *, timeout: float | None = None) -> Any:
        """:meth:`wait_for` for async handlers."""
        name = checks.check_signal_name(signal)
        if timeout is not None:
            timeout = checks.check_positive_seconds("timeout", timeout, 1e9)
        return await run_wait_async(self._step_site(), self._async(), name, timeout)

    def patched(self, name: str) -> bool:
        """Branch old and new in-flight jobs after a code change (sync handlers): True for
        a job that reaches this place under the new code (a marker step ``patch:<name>``
        is recorded here, so its reruns say True too), False for one whose earlier run
        recorded another step at this place (it ran the code from before the patch: take
        the old branch). ``if ctx.patched("v2-fetch"): new() else: old()``."""
        return run_patched(self._step_site(), self._sync(), check_step_name(name))

    async def patched_async(self, name: str) -> bool:
        """:meth:`patched` for async handlers."""
        return await run_patched_async(self._step_site(), self._async(), check_step_name(name))

    # -- fan-out with results (see leaseq/worker/spawns.py) ------------------------------

    def spawn(
        self, task: str, payload: Any = None, *, name: str | None = None, **options: Any
    ) -> int:
        """Enqueue a child job once per job (sync handlers): a step (``spawn-N`` or
        ``name``) whose record and the child commit together; reruns get the same id.
        ``options`` are ``enqueue``'s."""
        name = spawn_name(self, name, "spawn")
        return run_spawn(self, check_step_name(name), [(task, payload, options)])[0]

    async def spawn_async(
        self, task: str, payload: Any = None, *, name: str | None = None, **options: Any
    ) -> int:
        """:meth:`spawn` for async handlers."""
        name = spawn_name(self, name, "spawn")
        return (await run_spawn_async(self, check_step_name(name), [(task, payload, options)]))[0]

    def spawn_many(self, children: list[Any], *, name: str | None = None) -> list[int]:
        """:meth:`spawn` for several children at once, each ``(task, payload)`` or
        ``(task, payload, options)``: one step, one transaction."""
        name = spawn_name(self, name, "spawn")
        return run_spawn(self, check_step_name(name), [_child(c) for c in children])

    async def spawn_many_async(self, children: list[Any], *, name: str | None = None) -> list[int]:
        """:meth:`spawn_many` for async handlers."""
        name = spawn_name(self, name, "spawn")
        return await run_spawn_async(self, check_step_name(name), [_child(c) for c in children])

    def gather(
        self,
        children: list[int],
        *,
        poll: float = 60.0,
        return_failures: bool = False,
        name: str | None = None,
    ) -> list[Any]:
        """The stored results of ``children`` (sync handlers), once every one has ended:
        until then the job is suspended (holding no lease, slot or connection) and is woken
        by the end of the last of the children it spawned (``ctx.spawn``); it also looks
        again every ``poll`` seconds (a fallback: children not spawned by it, a wake-up
        skipped while another transaction held its row). A child that ended dead or cancelled raises
        :class:`ChildFailed`; with ``return_failures`` each child's outcome is returned
        as a dict (``JobResult``'s fields) instead. Recorded once as a step (``gather-N``)."""
        name = check_step_name(spawn_name(self, name, "gather"))
        poll = checks.check_positive_seconds("poll", poll, 3600)
        return run_gather(self, name, list(children), poll, return_failures)

    async def gather_async(
        self,
        children: list[int],
        *,
        poll: float = 60.0,
        return_failures: bool = False,
        name: str | None = None,
    ) -> list[Any]:
        """:meth:`gather` for async handlers."""
        name = check_step_name(spawn_name(self, name, "gather"))
        poll = checks.check_positive_seconds("poll", poll, 3600)
        return await run_gather_async(self, name, list(children), poll, return_failures)


def _child(spec: Any) -> tuple[str, Any, dict[str, Any]]:
    if not isinstance(spec, tuple | list) or len(spec) not in (2, 3):
        raise ConfigError(
            f"a child is (task, payload) or (task, payload, options), got {spec!r:.60}"
        )
    return (spec[0], spec[1], dict(spec[2]) if len(spec) == 3 else {})
