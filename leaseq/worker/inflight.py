"""The worker's running-jobs table and its one event hook.

``InFlight`` owns the leases this worker holds, keyed by (job id, token): after a lease loss
the worker may reclaim the same job while its stale attempt is still winding down, and the
two must never be confused. It also owns giving up on an attempt (``abort``) and the events
that tell claimers a slot came free.

``WorkerEvents`` is the single place where what the worker did is counted: each call site
reports an event once, and the hook updates both ``WorkerStats`` (returned by
``Worker.run``) and ``WorkerMetrics`` (served on ``/metrics``).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from leaseq.app import Task
from leaseq.codes import ErrorCode
from leaseq.metrics import WorkerMetrics
from leaseq.models import Failure, Lease, SweepResult
from leaseq.rules.schedules import TickRound
from leaseq.states import JobStatus
from leaseq.worker.context import JobContext
from leaseq.worker.stops import StopGate

log = logging.getLogger("leaseq.worker")
#: One record per job transition, with job_id, task, queue, attempt and token as fields
#: (see ``--log-format json``); successes at DEBUG, everything else at INFO or above.
jobs_log = logging.getLogger("leaseq.jobs")

_OUTCOME = {
    JobStatus.SUCCEEDED: "succeeded",
    JobStatus.PENDING: "retried",
    JobStatus.DEAD: "dead",
    JobStatus.CANCELLED: "cancelled",
}


def job_fields(lease: Lease) -> dict[str, Any]:
    return {
        "job_id": lease.job_id,
        "task": lease.task,
        "queue": lease.queue,
        "attempt": lease.attempt,
        "token": lease.token,
    }


@dataclass
class WorkerStats:
    """Counters of what this worker did (``Worker.run`` returns them)."""

    claimed: int = 0
    succeeded: int = 0
    failed: int = 0
    lost_leases: int = 0
    lost_fence_writes: int = 0
    heartbeat_failures: int = 0
    swept_requeued: int = 0
    swept_dead: int = 0
    swept_expired: int = 0
    released: int = 0
    #: Claimed leases dropped unstarted because they ended first (a slow claim round trip,
    #: a paused process, a wait for a thread): nothing was run or reported under them.
    late_starts: int = 0
    #: Claim statements (or the decoding of their rows) that failed on bad data.
    claim_errors: int = 0
    aborted: dict[str, int] = field(default_factory=dict)
    abandoned_at_shutdown: int = 0
    #: Sync handlers stopped by an exception raised in their thread (leaseq.worker.stops).
    soft_stops: int = 0
    #: Schedule ticks this worker's ticker enqueued, and skipped by policy.
    ticks_enqueued: int = 0
    ticks_skipped: int = 0
    #: At a burst or drain worker's exit: due jobs of its queues left behind a pause, and
    #: held otherwise (a concurrency limit, an ordering key running elsewhere).
    left_paused: int = 0
    left_held: int = 0


class Cancellable(Protocol):
    """What runs an attempt: its asyncio task, or a sync job (leaseq.worker.threads)."""

    def cancel(self) -> bool: ...


@dataclass(eq=False, slots=True, weakref_slot=True)
class Running:
    lease: Lease
    ctx: JobContext
    task_def: Task[Any] | None
    #: Monotonic time by which the lease surely ended unless a renewal was confirmed:
    #: measured from when the claim/renewal was *sent*, so it errs early.
    deadline: float
    started_at: float | None = None
    #: What the handler receives: the stored payload, or what the task's validate made of it.
    payload: Any = None
    #: The handler is done and its outcome is on its way to the database; the completer
    #: now owns the deadline (it gives up once the lease surely ended).
    reporting: bool = False
    abort_counted: bool = False
    task: Cancellable | None = None
    #: The handler's return value as JSON, with how long to keep it (store_result tasks).
    result: tuple[str, float] | None = None
    #: A sync attempt's hand-over with its thread (the soft stop); None for async ones.
    gate: StopGate | None = None
    #: Monotonic time of the soft stop, while the attempt's thread has not ended: its lease
    #: is still renewed and nothing is reported under it until then.
    stop_sent_at: float | None = None
    #: Monotonic time of the hard stop, if the thread is still running then.
    hard_stop_at: float | None = None
    #: The abort's own cancel of ``task`` is on its way (set just before it): a sync
    #: attempt's task takes that one as the soft stop's cue; any other cancel is from
    #: outside (the worker or its loop ending) and ends the task at once.
    abort_cancel: bool = False
    #: Given up on by such a cancel while its thread ran on: nothing is reported under
    #: the lease (it expires, and the sweep retries the job).
    abandoned: bool = False

    @property
    def key(self) -> tuple[int, int]:
        return (self.lease.job_id, self.lease.token)

    @property
    def watched(self) -> bool:
        """Still the lease keeper's to police: neither given up on nor already reporting."""
        return self.ctx.aborted is None and not self.reporting


class WorkerEvents:
    """The one event hook: every event is reported once and feeds stats and metrics."""

    def __init__(self, stats: WorkerStats, metrics: WorkerMetrics) -> None:
        self.stats = stats
        self.metrics = metrics

    def claimed(self, queue: str, leases: list[Lease], seconds: float) -> None:
        metrics = self.metrics
        metrics.claim_statement.observe(seconds)
        self.stats.claimed += len(leases)
        if not leases:
            return
        metrics.claimed.labels(queue).inc(len(leases))
        waited = metrics.claim_latency.labels(queue)
        for lease in leases:
            if lease.claimed_at is not None and lease.available_at is not None:
                waited.observe(max(0.0, (lease.claimed_at - lease.available_at).total_seconds()))

    def claim_error(self, queue: str) -> None:
        self.stats.claim_errors += 1
        self.metrics.claim_errors.labels(queue).inc()

    def late_start(self) -> None:
        self.stats.late_starts += 1
        self.metrics.late_starts.inc()

    def aborted(self, reason: str) -> None:
        self.metrics.leases_lost.labels(reason).inc()
        self.stats.aborted[reason] = self.stats.aborted.get(reason, 0) + 1
        if reason == ErrorCode.LEASE_LOST:
            self.stats.lost_leases += 1

    def committed_in_handler(self) -> None:
        """A fenced transaction committed the completion along with the handler's writes."""
        self.stats.succeeded += 1

    def finished(self, outcome: Lease | Failure, status: JobStatus) -> None:
        lease = outcome if isinstance(outcome, Lease) else outcome.lease
        metrics = self.metrics
        metrics.completion_latency.labels(lease.queue).observe(
            time.monotonic() - lease.claimed_monotonic
        )
        metrics.finished.inc(lease.queue, _OUTCOME[status])
        if isinstance(outcome, Lease):
            self.stats.succeeded += 1
            return
        self.stats.failed += 1
        if status is JobStatus.PENDING:
            metrics.retry(lease.queue, outcome.error_code, lease.attempt)

    def handler_stopped(self, kind: str) -> None:
        """A sync handler's soft stop was sent, or its hard stop is happening."""
        if kind == "soft":
            self.stats.soft_stops += 1
        self.metrics.handler_stops.labels(kind).inc()

    def lost_fence(self, operation: str, count: int = 1) -> None:
        """Fenced writes the database refused: the lease was gone."""
        if operation != "heartbeat":
            self.stats.lost_fence_writes += count
        self.metrics.lost_fence.labels(operation).inc(count)

    def heartbeat_failed(self) -> None:
        self.stats.heartbeat_failures += 1
        self.metrics.heartbeat_failures.inc()

    def swept(self, result: SweepResult) -> None:
        self.stats.swept_requeued += result.requeued
        self.stats.swept_dead += result.dead
        expirations = self.metrics.lease_expirations
        expirations.labels("requeued").inc(result.requeued)
        expirations.labels("dead").inc(result.dead)
        expirations.labels("cancelled").inc(result.cancelled)
        self.stats.swept_expired += result.expired
        self.metrics.jobs_expired.inc(result.expired)

    def released(self, count: int) -> None:
        self.stats.released += count

    def payload_objects_deleted(self, count: int) -> None:
        self.metrics.payload_objects_deleted.inc(count)

    def payload_orphans_removed(self, count: int) -> None:
        self.metrics.payload_orphans_removed.inc(count)

    def fair_keys_pruned(self, count: int) -> None:
        self.metrics.fair_keys_pruned.inc(count)

    def fair_keys_vacuumed(self) -> None:
        self.metrics.fair_keys_vacuums.inc()

    def ticked(self, result: TickRound) -> None:
        """A schedule ticker round (leaseq.worker.maintenance.Ticker)."""
        self.stats.ticks_enqueued += result.enqueued
        self.stats.ticks_skipped += result.skipped_catch_up + result.skipped_overlap
        ticks = self.metrics.schedule_ticks
        ticks.labels("enqueued").inc(result.enqueued)
        ticks.labels("skipped_catch_up").inc(result.skipped_catch_up)
        ticks.labels("skipped_overlap").inc(result.skipped_overlap)


class InFlight:
    """The (job id, token) -> Running table, and giving up on an attempt."""

    def __init__(self, events: WorkerEvents) -> None:
        self.events = events
        self._running: dict[tuple[int, int], Running] = {}
        #: Set whenever a lease leaves the table (the primary claimer's and shutdown's
        #: wake-up), and its twin for the extra claimers: clearing one must not hide a
        #: freed slot from the other.
        self.slot_freed = asyncio.Event()
        self.helper_slot_freed = asyncio.Event()
        #: Set when a lease joins with a deadline before the keeper's planned wake-up.
        self.sooner = asyncio.Event()
        self.keeper_wakes_at = 0.0
        self._loop: asyncio.AbstractEventLoop | None = None
        #: Leases whose outcome is with the completer, not yet committed (see reporting).
        self._reporting = 0

    def __len__(self) -> int:
        return len(self._running)

    def __contains__(self, running: Running) -> bool:
        return running.key in self._running

    def all(self) -> list[Running]:
        return list(self._running.values())

    def busy(self) -> int:
        """Slots running a handler now (read by the metrics thread: a copy, no lock)."""
        return sum(1 for r in list(self._running.values()) if r.started_at and not r.reporting)

    def add(self, running: Running) -> None:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        self._running[running.key] = running
        if running.deadline < self.keeper_wakes_at:
            self.sooner.set()  # the keeper must police this deadline, not sleep past it

    def started(self, running: Running, max_runtime: float) -> None:
        """An attempt with a ``max_runtime`` has just started (on the loop, or in a handler
        thread): wake the keeper if the runtime ends before its planned wake-up, so that the
        stop comes at ``max_runtime`` and not at the next renewal tick."""
        started_at = running.started_at
        loop = self._loop
        if started_at is None or loop is None:
            return
        if started_at + max_runtime < self.keeper_wakes_at:
            loop.call_soon_threadsafe(self.sooner.set)  # Event is not thread-safe

    def deadline_of(self, lease: Lease) -> float:
        """The local deadline of ``lease``'s attempt (``time.monotonic()``), or 0 once the
        attempt has left the table (JobContext reads it before each step)."""
        running = self._running.get((lease.job_id, lease.token))
        return 0.0 if running is None else running.deadline

    @property
    def reporting(self) -> int:
        """Leases of the table whose handler is done, their outcome on its way."""
        return self._reporting

    def reported(self, running: Running) -> None:
        """The handler is done and its outcome goes to the completer: its slot is free for
        the next claim (the fetcher counts it so), while its lease stays in the table until
        the completion commits. So a busy worker's next claim overlaps the completion's
        commit instead of waiting for it."""
        if running.reporting or running.key not in self._running:
            return
        running.reporting = True
        self._reporting += 1
        self.slot_freed.set()
        self.helper_slot_freed.set()

    def forget(self, running: Running) -> None:
        if self._running.pop(running.key, None) is running and running.reporting:
            self._reporting -= 1
        # Nothing cancels an attempt once it left: dropping its task ends the one cycle a
        # sync attempt has (its SyncJob names it back), so reference counting frees both.
        running.task = None
        self.slot_freed.set()
        self.helper_slot_freed.set()

    def abort(self, running: Running, reason: str) -> None:
        """Give up on an attempt: stop an async handler, tell a sync one through ctx; the
        job runner then reports the failure (or, for a lost lease, nothing)."""
        if not running.ctx.abort(reason):
            return
        self.count_abort(running, reason)
        log.warning(
            "job %d (token %d, task %s): %s; stopping its handler",
            running.lease.job_id,
            running.lease.token,
            running.lease.task,
            abort_detail(reason, running),
        )
        task = running.task
        if task is None or _not_begun(task):
            # An attempt whose task has not taken its first step is left to take it: a task
            # cancelled then would close its coroutine unrun, and so never report the abort
            # nor leave the table. Its first step finds ctx aborted (Executor._run_job).
            return
        # A sync handler gets the soft stop raised in its thread (leaseq.worker.stops);
        # its outcome, the abort's failure, is reported once that thread has ended.
        running.abort_cancel = True
        task.cancel()

    def count_abort(self, running: Running, reason: str) -> None:
        running.abort_counted = True
        self.events.aborted(reason)


def _not_begun(task: Cancellable) -> bool:
    """An attempt's asyncio task that has not run its first step yet (a sync attempt
    without a task is a SyncJob, whose cancel withdraws it cleanly at any point)."""
    return (
        isinstance(task, asyncio.Task)
        and inspect.getcoroutinestate(task.get_coro()) == inspect.CORO_CREATED  # type: ignore[arg-type]
    )


def abort_detail(reason: str, running: Running) -> str:
    task = running.task_def
    if reason == ErrorCode.NO_PROGRESS:
        return (
            f"no progress reported for {running.lease.lease_seconds:g}s (the lease length); "
            "call ctx.progress() or register the task with renew='alive'"
        )
    if reason == ErrorCode.MAX_RUNTIME_EXCEEDED and task is not None:
        return f"ran longer than max_runtime={task.max_runtime:g}s"
    if reason == ErrorCode.CANCELLED:
        return "cancel requested by an operator"
    if reason == ErrorCode.WORKER_SHUTDOWN:
        return "worker shut down before the job finished"
    if reason == ErrorCode.LEASE_LOST:
        return "lease lost (expired or taken over); result will not be reported"
    return reason
