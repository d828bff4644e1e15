"""The worker: claim, run outside any transaction, renew, report — on one event loop.

Pieces, each a coroutine:
- fetch loop: claims in batches sized by free slots (plus a small prefetch), then sleeps
  until woken (NOTIFY, a freed slot) or the poll interval passes; the poll always runs.
- job runners: one per claimed lease; async handlers on the loop, sync ones in threads.
- lease keeper: every tick, one fenced statement renews the leases that deserve it
  (progress policy), and each lease's *local deadline* is checked: if no renewal was
  confirmed before it, the worker assumes the lease is gone and stops the handler, even
  when the database cannot be reached to say so. It also enforces ``max_runtime``.
- completer: batches fenced completions and failures (see completer.py).
- sweeper: recovers expired leases of any worker; safe to run in every worker at once.
- listener: LISTEN connection that only sets the wake-up event.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
import time
import traceback
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from leaseq.app import App, Task
from leaseq.client import Client
from leaseq.client_async import AsyncClient
from leaseq.codes import ErrorCode
from leaseq.errors import Permanent, Retry
from leaseq.metrics import WorkerMetrics
from leaseq.models import Failure, Lease
from leaseq.observe import ObservabilityServer
from leaseq.retry import ErrorClass
from leaseq.states import JobStatus
from leaseq.worker.completer import Completer
from leaseq.worker.config import QueueSettings, WorkerConfig
from leaseq.worker.context import JobAborted, JobContext, JobServices
from leaseq.worker.fairness import WeightedShares
from leaseq.worker.listener import Listener
from leaseq.worker.outage import TRANSIENT, Outage

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


def _job_fields(lease: Lease) -> dict[str, Any]:
    return {
        "job_id": lease.job_id,
        "task": lease.task,
        "queue": lease.queue,
        "attempt": lease.attempt,
        "token": lease.token,
    }


#: Rows per retention batch: small, so each delete holds its locks and WAL burst briefly.
PRUNE_BATCH = 1000

#: Exit codes of ``leaseq worker`` (see README): clean stop; jobs had to be abandoned.
EXIT_OK = 0
EXIT_ABANDONED = 3


@dataclass
class WorkerStats:
    """Counters of what this worker did; the metrics issue exports them."""

    claimed: int = 0
    succeeded: int = 0
    failed: int = 0
    lost_leases: int = 0
    lost_fence_writes: int = 0
    heartbeat_failures: int = 0
    swept_requeued: int = 0
    swept_dead: int = 0
    released: int = 0
    aborted: dict[str, int] = field(default_factory=dict)
    by_error: dict[str, int] = field(default_factory=dict)
    abandoned_at_shutdown: int = 0

    def count_error(self, code: str) -> None:
        self.by_error[code] = self.by_error.get(code, 0) + 1


@dataclass(eq=False, slots=True)
class _Running:
    lease: Lease
    ctx: JobContext
    task_def: Task | None
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
    task: asyncio.Task[None] | None = None

    @property
    def key(self) -> tuple[int, int]:
        return (self.lease.job_id, self.lease.token)


class Worker:
    def __init__(
        self,
        app: App,
        config: WorkerConfig | None = None,
        *,
        client: AsyncClient | None = None,
    ) -> None:
        self.app = app
        self.config = config or WorkerConfig()
        self.client = client or AsyncClient(
            app.dsn,
            **app.client_options(),
            # claims, completions, renewals, sweeps; plus the extra claims in flight
            pool_size=3 + self.config.claims_in_flight,
            application_name="leaseq-worker",
        )
        # Handlers' own database work (fenced transactions, effect records) gets a pool of
        # its own, as large as the slots: it must never queue behind claims and renewals.
        # Connects on first use only.
        self._handler_client = AsyncClient(
            app.dsn,
            **app.client_options(),
            pool_size=self.config.concurrency,
            application_name="leaseq-handler",
        )
        self.stats = WorkerStats()
        self.outage = Outage(heal=self.client.check_connections)
        self.metrics = WorkerMetrics()
        self.metrics_port: int | None = None
        self._watch_gauges()
        # Keyed by (job id, token): after a lease loss this worker may reclaim the same job
        # while its stale attempt is still winding down; the two must not be confused.
        self._running: dict[tuple[int, int], _Running] = {}
        self._services: dict[str, JobServices] = {}  # one per task: they only depend on it
        self._slots = asyncio.Semaphore(self.config.concurrency)
        self._wake = asyncio.Event()
        self._slot_freed = asyncio.Event()
        self._stopping = asyncio.Event()
        # Claims in flight: the slots they may fill, whether the queues look busy (the last
        # claim came back full), and whether the fetch loop has ended.
        self._reserved = 0
        self._busy = asyncio.Event()
        self._helper_slot_freed = asyncio.Event()
        self._fetch_done = False
        self._round_cap = sum(self.config.batch_for(q) for q in self.config.queue_settings)
        self._forced = False
        self._completer = Completer(self.client, outage=self.outage)
        self._threads = ThreadPoolExecutor(
            max_workers=self.config.concurrency, thread_name_prefix="leaseq-job"
        )
        self._signals = 0
        self._renewal: asyncio.Task[None] | None = None
        self._policies = {name: t.retry for name, t in app.tasks.items() if t.retry is not None}
        self._shares = WeightedShares([q.weight for q in self.config.queue_settings])
        self._sync: Client | None = None
        self._sync_lock = threading.Lock()

    def _watch_gauges(self) -> None:
        """Gauges read on scrape (from the metrics thread: plain reads, no locking needed)."""
        m = self.metrics
        m.slots.set(self.config.concurrency)
        m.busy_slots.set_function(
            lambda: sum(1 for r in list(self._running.values()) if r.started_at and not r.reporting)
        )
        m.held_leases.set_function(lambda: len(self._running))
        m.database_up.set_function(lambda: 0 if self.outage.down else 1)
        for state in ("in_use", "idle", "waiting"):
            m.db_connections.labels(state).set_function(
                lambda state=state: self.client.pool_stats().get(state, 0)
            )

    @property
    def worker_id(self) -> str:
        return self.config.worker_id

    @property
    def running_count(self) -> int:
        return len(self._running)

    # -- lifecycle --------------------------------------------------------------------

    def stop(self) -> None:
        """Stop claiming; running jobs finish (up to shutdown_timeout) and the loop exits."""
        self._stopping.set()
        self._wake.set()
        self._slot_freed.set()

    def stop_now(self) -> None:
        """Stop claiming and abandon running jobs at once (second signal)."""
        self._forced = True
        self.stop()

    def _on_signal(self) -> None:
        self._signals += 1
        if self._signals == 1:
            log.warning(
                "shutdown requested: no new claims; waiting up to %gs for %d running job(s)",
                self.config.shutdown_timeout,
                len(self._running),
            )
            self.stop()
        else:
            log.warning("second signal: abandoning running jobs and exiting now")
            self.stop_now()

    async def run(self, *, install_signal_handlers: bool = False) -> WorkerStats:
        """Run until stopped (or, in burst/drain mode, until there is no more work)."""
        await self.client.check_schema()
        loop = asyncio.get_running_loop()
        observer = None
        if self.config.metrics_port is not None:
            observer = ObservabilityServer(
                self.metrics.registry,
                port=self.config.metrics_port,
                host=self.config.metrics_host,
                ready=lambda: not self.outage.down,
            ).start()
            self.metrics_port = observer.port
            log.info("metrics on http://%s:%d/metrics", self.config.metrics_host, observer.port)
        if install_signal_handlers:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self._on_signal)
        background = [
            asyncio.create_task(self._completer.run(), name="leaseq-completer"),
            asyncio.create_task(self._keep_leases(), name="leaseq-lease-keeper"),
            asyncio.create_task(self._sweep_loop(), name="leaseq-sweeper"),
        ]
        if self.config.retention is not None:
            background.append(asyncio.create_task(self._prune_loop(), name="leaseq-pruner"))
        if self.config.listen:
            listener = Listener(
                self.client,
                frozenset(self.config.queue_names),
                self._wake,
                dsn=self.config.listen_dsn,
            )
            background.append(asyncio.create_task(listener.run(), name="leaseq-listener"))
        log.info(
            "worker %s started: queues=%s concurrency=%d lease=%gs",
            self.worker_id,
            ",".join(self.config.queue_names),
            self.config.concurrency,
            self.config.lease_seconds,
        )
        try:
            await self._fetch_loop()
            await self._shutdown()
        finally:
            for task in background:
                task.cancel()
            for task in background:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            if install_signal_handlers:
                for sig in (signal.SIGTERM, signal.SIGINT):
                    loop.remove_signal_handler(sig)
            self._threads.shutdown(wait=False, cancel_futures=True)
            await self.client.close()
            await self._handler_client.close()
            if self._sync is not None:
                await asyncio.to_thread(self._sync.close)
            if observer is not None:
                observer.stop()
        log.info(
            "worker %s stopped: %d succeeded, %d failed, %d lost",
            self.worker_id,
            self.stats.succeeded,
            self.stats.failed,
            self.stats.lost_leases + self.stats.lost_fence_writes,
        )
        return self.stats

    async def _shutdown(self) -> None:
        # Leases claimed but not started go back at once, without charging an attempt.
        unstarted = [r for r in self._running.values() if r.started_at is None]
        for running in unstarted:
            if running.task is not None:
                running.task.cancel()
            # A task cancelled before its first step never runs its own cleanup.
            self._forget(running)
        if unstarted:
            with contextlib.suppress(*TRANSIENT):
                async with asyncio.timeout(self.config.op_timeout):
                    released = await self.client.release_many([r.lease for r in unstarted])
                    self.stats.released += len(released)
                    log.info("released %d unstarted lease(s)", len(released))
        deadline = time.monotonic() + self.config.shutdown_timeout
        while self._running and not self._forced and time.monotonic() < deadline:
            self._slot_freed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._slot_freed.wait(), deadline - time.monotonic())
        left = [r for r in self._running.values() if r.started_at is not None]
        if left:
            log.warning("abandoning %d running job(s) at shutdown; they will be retried", len(left))
            self.stats.abandoned_at_shutdown = len(left)
            for running in left:
                self._abort(running, ErrorCode.WORKER_SHUTDOWN)
            # Give the fenced failure reports a moment; whatever does not make it expires.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(min(5.0, self.config.op_timeout)):
                    while self._running:
                        self._slot_freed.clear()
                        await self._slot_freed.wait()

    # -- fetching ---------------------------------------------------------------------

    async def _fetch_loop(self) -> None:
        """Claim whenever slots are free. While the queues are busy (the last claim came back
        full) up to ``claims_in_flight`` claims run at once, on their own connections: one
        claim at a time would cap a worker at one batch per round trip."""
        helpers = [
            asyncio.create_task(self._helper_claims(), name=f"leaseq-claims-{i + 1}")
            for i in range(self.config.claims_in_flight - 1)
        ]
        try:
            await self._primary_claims()
        finally:
            # Helpers never stop mid-claim (its jobs would be stranded until their leases
            # expire): they see the stop between claims.
            self._fetch_done = True
            self._busy.set()
            self._helper_slot_freed.set()
            # Not suppressing CancelledError here: a cancelled worker must stay cancelled.
            outcomes = await asyncio.gather(*helpers, return_exceptions=True)
        for outcome in outcomes:
            if isinstance(outcome, Exception):
                raise outcome  # as the primary's own error would

    async def _primary_claims(self) -> None:
        cfg = self.config
        while not self._stopping.is_set():
            free = self._free_slots()
            if free <= 0:
                self._slot_freed.clear()
                await self._slot_freed.wait()
                continue
            # Both events are re-armed before the claim: a wake-up or a freed slot that
            # arrives while it runs ends the next sleep at once, and nothing older does (a
            # stale "slot freed" left set made an idle worker spin on claims).
            self._wake.clear()
            self._slot_freed.clear()
            # Only a claim that *started* with nothing in flight can prove the queues empty:
            # a job finishing during the claim may have made more work claimable (a retry,
            # the next job of its ordering key) after the claim's snapshot was taken, and a
            # helper's claim may be taking jobs right now.
            idle = not self._running and not self._reserved
            try:
                async with asyncio.timeout(cfg.op_timeout):
                    claimed, exhausted = await self._reserved_round(free)
                    self.outage.ok()
                    if claimed and not exhausted:
                        continue  # more may be waiting: go again at once
                    if (
                        not claimed
                        and idle
                        and not self._running
                        and not self._reserved
                        and await self._finished()
                    ):
                        return
            except TRANSIENT as exc:
                await self.outage.failed("claim", exc)
                await self._sleep_or_wake(self.outage.backoff())
                continue
            await self._sleep_or_wake(cfg.poll_interval)

    async def _helper_claims(self) -> None:
        """An extra claimer: idle unless the last claim came back full; never polls, and
        leaves outages to the primary loop (which backs off and reports them)."""
        try:
            await self._helper_loop()
        except Exception:
            self.stop()  # an error the primary would have died of stops the worker too
            raise

    async def _helper_loop(self) -> None:
        # The stop is checked after every wait: a claim that ends after the fetch loop's
        # final "wake up" may clear _busy again, and waiting for it then would hang the
        # shutdown (seen once when a busy worker got SIGTERM).
        while not (self._fetch_done or self._stopping.is_set()):
            if not self._busy.is_set():
                await self._busy.wait()
                continue
            free = self._free_slots()
            if free <= 0:
                # An event of its own: clearing the primary's would hide from it a job
                # that finished during its claim.
                self._helper_slot_freed.clear()
                await self._helper_slot_freed.wait()
                continue
            try:
                async with asyncio.timeout(self.config.op_timeout):
                    claimed, exhausted = await self._reserved_round(free, helper=True)
            except TRANSIENT:
                claimed, exhausted = 0, True
            if not claimed or exhausted:
                self._busy.clear()

    def _free_slots(self) -> int:
        """Slots neither running a job nor promised to a claim in flight; one claim round
        takes at most one batch per queue, so the other claimers get the rest."""
        cfg = self.config
        free = cfg.concurrency + cfg.prefetch - len(self._running) - self._reserved
        return min(free, self._round_cap)

    async def _reserved_round(self, free: int, *, helper: bool = False) -> tuple[int, bool]:
        self._reserved += free
        try:
            claimed, exhausted = await self._claim_round(free)
        finally:
            self._reserved -= free
            if helper:
                # The primary may have found the queues empty while this claim was in
                # flight, which kept it from concluding "idle": let it look again.
                self._slot_freed.set()
        if claimed and not exhausted:
            self._busy.set()
        return claimed, exhausted

    async def _claim_round(self, free: int) -> tuple[int, bool]:
        """Split the free slots between the queues by weight and claim; slots a queue
        leaves unused (it ran dry) go to the others. Returns (claimed, all queues empty)."""
        queues = self.config.queue_settings
        claimed = 0
        hungry = [True] * len(queues)  # still returning everything asked of it
        while free - claimed > 0 and any(hungry):
            shares = self._shares.split(free - claimed, hungry)
            progressed = False
            for i, queue in enumerate(queues):
                want = min(shares[i], self.config.batch_for(queue))
                if want <= 0:
                    continue
                leases = await self._claim(queue, want)
                claimed += len(leases)
                progressed = progressed or bool(leases)
                if len(leases) < want:
                    hungry[i] = False
            if not progressed:
                break
        return claimed, not any(hungry)

    async def _claim(self, queue: QueueSettings, limit: int) -> list[Lease]:
        lease_seconds = self.config.lease_for(queue)
        sent = time.monotonic()
        leases = await self.client.claim(
            queue.name, worker=self.worker_id, lease_seconds=lease_seconds, limit=limit
        )
        self.metrics.claim_statement.observe(time.monotonic() - sent)
        self.stats.claimed += len(leases)
        if leases:
            self.metrics.claimed.labels(queue.name).inc(len(leases))
            waited = self.metrics.claim_latency.labels(queue.name)
            for lease in leases:
                if lease.claimed_at is not None and lease.available_at is not None:
                    waited.observe(
                        max(0.0, (lease.claimed_at - lease.available_at).total_seconds())
                    )
        for lease in leases:
            self._start(lease, sent + lease_seconds)
        return leases

    async def _finished(self) -> bool:
        """In burst mode: nothing claimable now. In drain mode: nothing left at all."""
        if self.config.drain:
            return not await self.client.queues_have_work(self.config.queue_names)
        return self.config.burst

    async def _sleep_or_wake(self, seconds: float) -> None:
        waiters = [
            asyncio.ensure_future(self._wake.wait()),
            asyncio.ensure_future(self._slot_freed.wait()),
        ]
        try:
            await asyncio.wait(waiters, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()

    # -- running jobs -----------------------------------------------------------------

    def _start(self, lease: Lease, deadline: float) -> None:
        task = self.app.tasks.get(lease.task)
        services = None if task is None else self._services_for(task)
        running = _Running(lease, JobContext(lease, self.worker_id, services), task, deadline)
        self._running[running.key] = running
        # Unnamed: a name costs a formatted string per job (job ids are in the logs).
        running.task = asyncio.create_task(self._run_job(running))

    def _services_for(self, task: Task) -> JobServices:
        services = self._services.get(task.name)
        if services is None:
            services = self._services[task.name] = JobServices(
                sync_client=None if task.is_async else self._sync_client,
                async_client=self._handler_client if task.is_async else None,
                reconcilers=task.reconcile,
            )
        return services

    async def _run_job(self, running: _Running) -> None:
        lease, ctx = running.lease, running.ctx
        handed_over = False
        try:
            try:
                async with self._slots:
                    outcome = lease if ctx.aborted else await self._execute(running)
            except asyncio.CancelledError:
                if ctx.aborted is None:
                    raise  # cancelled from outside (shutdown of an unstarted job)
                outcome = lease  # replaced in _submit by the abort's own outcome
            if ctx.completion_pending and not ctx.aborted:
                outcome = await self._check_joined_completion(running, outcome)
            handed_over = self._submit(running, outcome)
        finally:
            if not handed_over:
                self._forget(running)

    async def _check_joined_completion(
        self, running: _Running, outcome: Lease | Failure
    ) -> Lease | Failure:
        """The handler joined the completion to its own transaction (``ctx.complete_in``):
        find out whether that transaction committed it."""
        lease = running.lease
        for _ in range(3):
            try:
                job = await self.client.get_job(lease.job_id)
                break
            except TRANSIENT as exc:
                await self.outage.failed("completion check", exc)
                await asyncio.sleep(self.outage.backoff())
        else:
            return outcome  # cannot tell: a fenced report is still safe either way
        if job is not None and job.status == "succeeded" and job.lease_token == lease.token:
            running.ctx.mark_completed()
            return outcome
        return Failure(
            lease,
            ErrorCode.COMPLETION_NOT_COMMITTED,
            error_class=ErrorClass.TRANSIENT,
            detail="ctx.complete_in() was called but its transaction did not commit",
            policy=running.task_def.retry if running.task_def else None,
        )

    def _submit(self, running: _Running, outcome: Lease | Failure) -> bool:
        """Hand the outcome to the completer; False when there is nothing to report."""
        lease, reason = running.lease, running.ctx.aborted
        if reason is not None and not running.abort_counted:
            self._count_abort(running, reason)  # the handler's own ctx found it out
        if reason == ErrorCode.LEASE_LOST:
            return False  # someone else may own the job now: report nothing, ever
        if running.ctx.completed:
            # A fenced transaction already committed the completion with the handler's
            # writes; an error raised after that block changes nothing.
            self.stats.succeeded += 1
            return False
        if reason is not None:
            outcome = Failure(
                lease,
                reason,
                error_class=ErrorClass.TRANSIENT,
                detail=_abort_detail(reason, running),
                policy=running.task_def.retry if running.task_def else None,
            )
        running.reporting = True
        self._completer.submit(
            outcome,
            deadline=running.deadline,
            on_done=lambda status: self._recorded(running, outcome, status),
        )
        return True

    def _recorded(
        self, running: _Running, outcome: Lease | Failure, status: JobStatus | None
    ) -> None:
        self._forget(running)
        lease = running.lease
        if status is None:
            self.stats.lost_fence_writes += 1
            operation = "complete" if isinstance(outcome, Lease) else "fail"
            self.metrics.lost_fence.labels(operation).inc()
            log.warning(
                "job %d: lease (token %d) was lost before its result was recorded; "
                "result discarded",
                lease.job_id,
                lease.token,
            )
            return
        metrics = self.metrics
        metrics.completion_latency.labels(lease.queue).observe(
            time.monotonic() - lease.claimed_monotonic
        )
        metrics.finished.inc(lease.queue, _OUTCOME[status])
        if isinstance(outcome, Lease):
            self.stats.succeeded += 1
            if jobs_log.isEnabledFor(logging.DEBUG):
                jobs_log.debug("job %d succeeded", lease.job_id, extra=_job_fields(lease))
            return
        self.stats.failed += 1
        self.stats.count_error(outcome.error_code)
        if status is JobStatus.PENDING:
            self.metrics.retry(lease.queue, outcome.error_code, lease.attempt)
        jobs_log.info(
            "job %d %s after attempt %d: %s",
            lease.job_id,
            "will be retried" if status is JobStatus.PENDING else str(status),
            lease.attempt,
            outcome.error_code,
            extra={**_job_fields(lease), "status": str(status), "error_code": outcome.error_code},
        )

    def _forget(self, running: _Running) -> None:
        self._running.pop(running.key, None)
        self._slot_freed.set()
        self._helper_slot_freed.set()

    async def _execute(self, running: _Running) -> Lease | Failure:
        lease, ctx, task = running.lease, running.ctx, running.task_def
        if task is None:
            return Failure(
                lease,
                ErrorCode.UNKNOWN_TASK,
                error_class=ErrorClass.PERMANENT,
                detail=f"no handler registered for task {lease.task!r} in this worker's app",
            )
        running.payload, refused = _prepare_payload(task, lease)
        if refused is not None:
            return refused
        try:
            if task.is_async:
                self._mark_started(running)
                await task.fn(ctx, running.payload)
            else:
                loop = asyncio.get_running_loop()
                await loop.run_in_executor(self._threads, self._call_sync, running, task)
        except JobAborted:
            return lease  # the abort decides what is reported
        except Exception as exc:
            error_class, code = task.classifier.classify(exc)
            if isinstance(exc, Permanent | Retry):
                detail = exc.detail
            else:  # unclassified or rule-matched: keep the whole (bounded) traceback
                detail = "".join(traceback.format_exception(exc))
            return Failure(
                lease,
                code,
                error_class=error_class,
                detail=detail,
                retry_in=exc.retry_in if isinstance(exc, Retry) else None,
                policy=task.retry,
            )
        return lease

    def _call_sync(self, running: _Running, task: Task) -> None:
        # Runs in a pool thread. A job queued behind busy threads has not started yet:
        # it counts as started (and so is charged, and waited for at shutdown) from here.
        if running.ctx.aborted is not None:
            return
        self._mark_started(running)
        task.fn(running.ctx, running.payload)

    @staticmethod
    def _mark_started(running: _Running) -> None:
        running.started_at = time.monotonic()
        running.ctx.mark_started()

    def _abort(self, running: _Running, reason: str) -> None:
        """Give up on an attempt: stop an async handler, tell a sync one through ctx; the
        job runner then reports the failure (or, for a lost lease, nothing)."""
        if not running.ctx.abort(reason):
            return
        self._count_abort(running, reason)
        log.warning(
            "job %d (token %d, task %s): %s; stopping its handler",
            running.lease.job_id,
            running.lease.token,
            running.lease.task,
            _abort_detail(reason, running),
        )
        if running.task is not None:
            # For a sync handler this only stops waiting for its thread; the thread sees
            # ctx.aborted / gets JobAborted from ctx.progress(), and its result is ignored.
            running.task.cancel()

    def _count_abort(self, running: _Running, reason: str) -> None:
        running.abort_counted = True
        self.metrics.leases_lost.labels(reason).inc()
        self.stats.aborted[reason] = self.stats.aborted.get(reason, 0) + 1
        if reason == ErrorCode.LEASE_LOST:
            self.stats.lost_leases += 1

    def _sync_client(self) -> Client:
        """The sync client sync handlers use for effects and fenced transactions; made on
        first use (from a handler thread), with a pool as large as the slots."""
        with self._sync_lock:
            if self._sync is None:
                self._sync = Client(
                    self.app.dsn,
                    **self.app.client_options(),
                    pool_size=self.config.concurrency,
                    application_name="leaseq-handler",
                )
            return self._sync

    # -- leases -----------------------------------------------------------------------

    async def _keep_leases(self) -> None:
        """Renew on a fixed tick; between ticks, wake for the earliest local deadline."""
        tick = self.config.renew_every
        next_renewal = time.monotonic() + tick
        while True:
            now = time.monotonic()
            earliest = min(
                (r.deadline for r in self._running.values() if self._watched(r)),
                default=now + tick,
            )
            await asyncio.sleep(max(0.0, min(next_renewal, earliest) - now) + 0.001)
            now = time.monotonic()
            self._check_deadlines(now)
            if now >= next_renewal:
                next_renewal = now + tick
                if self._renewal is None or self._renewal.done():
                    # Its own task: a renewal stuck on a dead connection must not stop the
                    # deadline checks above from firing.
                    self._renewal = asyncio.create_task(self._renew(tick))

    @staticmethod
    def _watched(running: _Running) -> bool:
        """Still this loop's to police: neither given up on nor already reporting."""
        return running.ctx.aborted is None and not running.reporting

    def _check_deadlines(self, now: float) -> None:
        for running in list(self._running.values()):
            if not self._watched(running):
                continue
            if running.deadline <= now:
                self._abort(running, ErrorCode.LEASE_LOST)
                continue
            task = running.task_def
            if running.started_at is None or task is None:
                continue
            if task.max_runtime is not None and now - running.started_at > task.max_runtime:
                self._abort(running, ErrorCode.MAX_RUNTIME_EXCEEDED)

    def _deserves_renewal(self, running: _Running, now: float) -> bool:
        if running.ctx.aborted is not None:
            return False
        if running.started_at is None or running.task_def is None or running.reporting:
            return True  # waiting for a slot, or its outcome is being written: keep it
        if running.task_def.renew == "alive":
            return True
        return now - running.ctx.last_progress <= running.lease.lease_seconds

    async def _renew(self, tick: float) -> None:
        now = time.monotonic()
        current = list(self._running.values())
        keep = [r for r in current if self._deserves_renewal(r, now)]
        for running in current:
            # No progress within a lease length: stop before the lease runs out, and report
            # it (fenced, while the lease still holds) so the retry policy applies at once.
            if running not in keep and self._watched(running):
                self._abort(running, ErrorCode.NO_PROGRESS)
        by_length: dict[float, list[_Running]] = {}
        for running in keep:
            by_length.setdefault(running.lease.lease_seconds, []).append(running)
        for seconds, group in by_length.items():
            sent = time.monotonic()
            try:
                async with asyncio.timeout(min(tick, self.config.op_timeout)):
                    result = await self.client.heartbeat_many(
                        [r.lease for r in group], lease_seconds=seconds
                    )
                self.outage.ok()
            except TRANSIENT as exc:
                self.stats.heartbeat_failures += 1
                self.metrics.heartbeat_failures.inc()
                await self.outage.failed("lease renewal", exc)
                continue
            if result.lost:
                self.metrics.lost_fence.labels("heartbeat").inc(len(result.lost))
            for running in group:
                if running.key in result.lost:
                    if running.key in self._running:
                        self._abort(running, ErrorCode.LEASE_LOST)
                else:
                    running.deadline = sent + seconds
                    if running.lease.job_id in result.cancel_requested:
                        self._abort(running, ErrorCode.CANCELLED)

    async def _sweep_loop(self) -> None:
        actor = f"sweeper:{self.worker_id}"
        aging = self.config.priority_aging
        next_aging = time.monotonic()
        while True:
            if aging is not None and time.monotonic() >= next_aging:
                # Aging moves in whole intervals; checking a few times per interval keeps
                # the bound tight without rescanning the backlog on every sweep.
                next_aging = time.monotonic() + aging / 4
                try:
                    async with asyncio.timeout(max(self.config.op_timeout, 30.0)):
                        await self.client.age_priorities(interval=aging)
                except TRANSIENT as exc:
                    await self.outage.failed("priority aging", exc)
            try:
                async with asyncio.timeout(max(self.config.op_timeout, 30.0)):
                    result = await self.client.sweep(actor=actor, policies=self._policies)
                self.stats.swept_requeued += result.requeued
                self.stats.swept_dead += result.dead
                self.metrics.lease_expirations.labels("requeued").inc(result.requeued)
                self.metrics.lease_expirations.labels("dead").inc(result.dead)
                self.metrics.lease_expirations.labels("cancelled").inc(result.cancelled)
                if result.total:
                    log.info(
                        "sweeper recovered %d expired lease(s): %d requeued, %d dead",
                        result.total,
                        result.requeued,
                        result.dead,
                    )
            except TRANSIENT as exc:
                await self.outage.failed("sweep", exc)
            await asyncio.sleep(self.config.sweep_interval)

    async def _prune_loop(self) -> None:
        """Retention: every interval, prune until nothing is left to prune, in small batches
        paced so that deleting takes at most ``prune_share`` of the time. A fixed number of
        batches per interval (ten, at first) fell behind any sustained load: at 3,000 jobs/s
        the table grew without end (python -m bench.sustained)."""
        retention = self.config.retention
        assert retention is not None
        while True:
            await asyncio.sleep(self.config.prune_interval)
            pruned = 0
            try:
                while True:
                    started = time.monotonic()
                    async with asyncio.timeout(max(self.config.op_timeout, 30.0)):
                        done = await self.client.prune(
                            older_than=retention, batch_size=PRUNE_BATCH, max_batches=1
                        )
                    pruned += done
                    if done < PRUNE_BATCH:
                        break
                    spent = time.monotonic() - started
                    await asyncio.sleep(spent * (1 / self.config.prune_share - 1))
            except TRANSIENT as exc:
                await self.outage.failed("prune", exc)
            if pruned:
                log.info("pruned %d finished job(s) older than %gs", pruned, retention)


def _prepare_payload(task: Task, lease: Lease) -> tuple[Any, Failure | None]:
    """Check (and convert) the payload before the handler runs. A refusal is permanent —
    retrying cannot fix a payload — so the job goes dead at once with a clear code."""
    versions = task.payload_versions
    if versions is not None and lease.payload_version not in versions:
        return None, Failure(
            lease,
            ErrorCode.UNSUPPORTED_PAYLOAD_VERSION,
            error_class=ErrorClass.PERMANENT,
            detail=(
                f"payload version {lease.payload_version} is not one task {task.name} "
                f"accepts ({', '.join(map(str, sorted(versions)))})"
            ),
        )
    if task.validate is None:
        return lease.payload, None
    try:
        return task.validate(lease.payload), None
    except Exception as exc:
        return None, Failure(
            lease,
            ErrorCode.INVALID_PAYLOAD,
            error_class=ErrorClass.PERMANENT,
            detail=f"{type(exc).__name__}: {exc}",
        )


def _abort_detail(reason: str, running: _Running) -> str:
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


def run_worker(
    app: App,
    config: WorkerConfig,
    *,
    install_signal_handlers: bool = True,
    on_ready: Callable[[Worker], Awaitable[None]] | None = None,
) -> WorkerStats:
    """Run a worker on a fresh event loop until it stops; returns its counters."""

    async def main() -> WorkerStats:
        worker = Worker(app, config)
        if on_ready is not None:
            await on_ready(worker)
        return await worker.run(install_signal_handlers=install_signal_handlers)

    return asyncio.run(main())


def exit_code(stats: WorkerStats) -> int:
    return EXIT_ABANDONED if stats.abandoned_at_shutdown else EXIT_OK
