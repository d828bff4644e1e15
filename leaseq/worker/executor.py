"""One attempt of one job: from a claimed lease to an outcome handed to the completer.

For each lease: wait for a slot, check the payload (version, the task's validate), check
that the lease can still be valid, run the handler (async ones on the loop, sync ones in a
pool thread), classify what it raised, and hand the outcome to the completer; once the
completer knows what was committed, count it and log it.

An async attempt is a task on the loop. A sync attempt has no task (unless tracing needs
one): it is granted a slot, run whole by a pool thread (threads.py), and its outcome comes
back in a batch with others; ``SyncJob.cancel`` stands in for a task's cancel.

A handler never starts under a lease whose local deadline has passed (a claim that took
longer than the lease, a paused process, a sync job that waited for a thread): the lease is
surely gone or about to be, so the attempt is dropped with nothing reported under it, and
the sweeper recovers the job.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
from collections.abc import Awaitable
from typing import Any, TypeVar

from leaseq.app import App, Task
from leaseq.client import Client
from leaseq.client_async import AsyncClient
from leaseq.codes import ErrorCode
from leaseq.models import Failure, Lease
from leaseq.retry import ErrorClass
from leaseq.states import JobStatus
from leaseq.worker.aborts import JobAborted
from leaseq.worker.attempt import failure_of, prepare_payload, result_of, unknown_task
from leaseq.worker.completer import Completer
from leaseq.worker.config import WorkerConfig
from leaseq.worker.context import JobContext, JobServices
from leaseq.worker.inflight import InFlight, Running, abort_detail, job_fields, jobs_log
from leaseq.worker.outage import TRANSIENT, Outage
from leaseq.worker.recorder import StepRecorder
from leaseq.worker.stops import StopGate
from leaseq.worker.threads import HandlerThreads, Outcome, Slots, SyncJob

log = logging.getLogger("leaseq.worker")
T = TypeVar("T")


class Executor:
    """Starts and runs attempts; owns the handler slots, threads and handler clients."""

    def __init__(
        self,
        app: App,
        config: WorkerConfig,
        client: AsyncClient,
        inflight: InFlight,
        completer: Completer,
        outage: Outage,
    ) -> None:
        self.app = app
        self.config = config
        self.client = client
        self.inflight = inflight
        self.events = inflight.events
        self._deadline_of = inflight.deadline_of  # one bound method for every attempt
        self._completer = completer
        self._outage = outage
        # Handlers' own database work (fenced transactions, effect records) gets a pool of
        # its own, as large as the slots: it must never queue behind claims and renewals.
        # Connects on first use only.
        self._handler_client = AsyncClient(
            app.dsn,
            **app.client_options(),
            pool_size=config.concurrency,
            application_name="leaseq-handler",
        )
        # Records of steps without a transaction of their own, several jobs' in one write.
        self._recorder = StepRecorder(self._handler_client, timeout=2 * config.op_timeout + 30)
        self._services: dict[str, JobServices] = {}  # one per task: they only depend on it
        self._slots = Slots(config.concurrency)
        # As many threads as slots: an abandoned sync handler keeps its thread until it
        # returns, and a job queued behind it may then start late (or not at all).
        self._threads = HandlerThreads(
            config.concurrency, functools.partial(_sync_attempt, inflight), self._sync_done
        )
        self._sync: Client | None = None
        self._sync_lock = threading.Lock()
        self._side_tasks: set[asyncio.Task[None]] = set()

    async def close(self) -> None:
        await self._recorder.close()
        self._threads.close()
        await self._handler_client.close()
        if self._sync is not None:
            await asyncio.to_thread(self._sync.close)

    def start(self, lease: Lease, deadline: float) -> None:
        task = self.app.tasks.get(lease.task)
        services = None if task is None else self._services_for(task)
        ctx = JobContext(lease, self.config.worker_id, services)
        running = Running(lease, ctx, task, deadline)
        # Read from the table by lease, not through a closure over `running` (which holds
        # ctx: a reference cycle per job, left to the cyclic GC, measured +6 us CPU a job).
        ctx.watch_deadline(self._deadline_of)
        if task is not None and not task.is_async:
            running.gate = StopGate()
        self.inflight.add(running)
        if task is not None and not task.is_async and self.app.tracing is None:
            job = SyncJob(running, self._cancel_sync)
            running.task = job
            self._slots.take(lambda: self._granted(job))
            return
        # Unnamed: a name costs a formatted string per job (job ids are in the logs). No
        # done callback (one more loop callback per job): an abort never cancels a task
        # before its first step (InFlight.abort), which then finds ctx aborted itself.
        running.task = asyncio.create_task(self._run_job(running))

    # -- sync attempts without a task ---------------------------------------------------

    def _granted(self, job: SyncJob) -> bool:
        """A slot for a sync job: on to the threads (False: the job was withdrawn)."""
        if job.finished:
            return False
        job.has_slot = True
        self._threads.submit(job)
        return True

    def _sync_done(self, job: SyncJob, outcome: Outcome) -> None:
        """A thread handed back an attempt's outcome (on the loop, in a batch)."""
        running = job.running
        if running.stop_sent_at is not None:
            log.info(
                "job %d (token %d): its handler thread ended %.1fs after the soft stop",
                running.lease.job_id,
                running.lease.token,
                time.monotonic() - running.stop_sent_at,
            )
            running.stop_sent_at = running.hard_stop_at = None
        waiter = job.waiter
        if waiter is not None:
            if not waiter.done():
                waiter.set_result(outcome)
        elif not job.finished:  # else given up on already (an abort): nothing more to do
            self._finish_sync(job, outcome)

    def _cancel_sync(self, job: SyncJob) -> bool:
        """``Running.task.cancel()`` for a sync job, as a task's cancel would behave: a job no
        thread has taken is withdrawn (True); one a thread has taken gets the soft stop if
        it was aborted, and its outcome (the abort's failure) is reported once the thread
        hands it back. False once a thread took the job: shutdown must treat it as
        running, not release its lease."""
        if job.finished:
            return False
        running = job.running
        if self._threads.withdraw(job):
            if running.ctx.aborted is not None:
                self._finish_sync(job, running.lease)  # never ran: _submit reports the abort
            else:
                job.finished = True  # shut down unstarted: the caller releases the lease
                self._give_back(job)
                self.inflight.forget(running)
            return True
        if running.ctx.aborted is not None:
            self._soft_stop(running)
        return False

    def _soft_stop(self, running: Running) -> None:
        """Raise the soft stop in the attempt's thread (leaseq.worker.stops) and set the
        hard stop's time; the lease keeper keeps renewing the lease until the thread ends."""
        gate = running.gate
        if gate is None or running.stop_sent_at is not None:
            return
        now = running.stop_sent_at = time.monotonic()
        grace = self.config.stop_grace
        if grace is not None:
            running.hard_stop_at = now + grace
            if running.hard_stop_at < self.inflight.keeper_wakes_at:
                self.inflight.sooner.set()
        if not gate.request():
            return  # its handler has not started (it will not) or has just returned
        self.events.handler_stopped("soft")
        lease = running.lease
        log.warning(
            "job %d (token %d, task %s): soft stop: HandlerStopped raised in its handler "
            "thread; its lease is kept until the thread ends%s",
            lease.job_id,
            lease.token,
            lease.task,
            "" if grace is None else f" (hard stop in {grace:g}s)",
        )

    def _finish_sync(self, job: SyncJob, outcome: Outcome) -> None:
        job.finished = True
        self._give_back(job)
        running = job.running
        if running.ctx.completion_pending and not running.ctx.aborted:
            side = asyncio.create_task(self._joined_then_submit(running, outcome))
            self._side_tasks.add(side)
            side.add_done_callback(self._side_tasks.discard)
            return
        if not self._submit(running, outcome):
            self.inflight.forget(running)

    def _give_back(self, job: SyncJob) -> None:
        if job.has_slot:
            job.has_slot = False
            self._slots.give_back()

    async def _joined_then_submit(self, running: Running, outcome: Outcome) -> None:
        handed_over = False
        try:
            outcome = await self._check_joined_completion(running, outcome)
            handed_over = self._submit(running, outcome)
        finally:
            if not handed_over:
                self.inflight.forget(running)

    def _services_for(self, task: Task[Any]) -> JobServices:
        services = self._services.get(task.name)
        if services is None:
            services = self._services[task.name] = JobServices(
                sync_client=None if task.is_async else self._sync_client,
                async_client=self._handler_client if task.is_async else None,
                reconcilers=task.reconcile,
                recorder=self._recorder,
            )
            self._recorder.bind(asyncio.get_running_loop())
        return services

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

    async def _run_job(self, running: Running) -> None:
        lease, ctx = running.lease, running.ctx
        handed_over = False
        try:
            try:
                if ctx.aborted:
                    outcome: Lease | Failure = lease  # aborted before this first step
                else:
                    await self._slots.acquire()
                    try:
                        outcome = lease if ctx.aborted else await self._execute(running)
                    finally:
                        self._slots.give_back()
            except asyncio.CancelledError:
                if ctx.aborted is None or running.abandoned:
                    raise  # cancelled from outside (shutdown of an unstarted job, the loop)
                outcome = lease  # replaced in _submit by the abort's own outcome
            if ctx.completion_pending and not ctx.aborted:
                outcome = await self._check_joined_completion(running, outcome)
            handed_over = self._submit(running, outcome)
        finally:
            if not handed_over:
                self.inflight.forget(running)

    async def _execute(self, running: Running) -> Lease | Failure:
        tracing = self.app.tracing
        if tracing is None:
            return await self._attempt(running)
        lease = running.lease
        stored = await self._traces("read", self.client.trace_context(lease.job_id))
        with tracing.process(lease, stored) as scope:
            outcome = await self._attempt(running)
            scope.finished(outcome if isinstance(outcome, Failure) else None)
        carrier = scope.carrier() if isinstance(outcome, Failure) else None
        if carrier:
            await self._traces("write", self.client.record_attempt_trace(lease, carrier))
        return outcome

    async def _traces(self, what: str, op: Awaitable[T]) -> T | None:
        """Tracing's own reads and writes never fail an attempt: a lost trace link is
        logged, the job goes on."""
        try:
            return await op
        except TRANSIENT as exc:
            log.debug("could not %s a job's trace context: %s", what, exc)
            return None

    async def _attempt(self, running: Running) -> Lease | Failure:
        lease, ctx, task = running.lease, running.ctx, running.task_def
        if _too_late(running):
            return lease  # dropped: _submit reports nothing under this lease
        if task is None:
            return unknown_task(lease)
        if not task.is_async:
            return await self._in_thread(running)
        running.payload, refused = prepare_payload(task, lease)
        if refused is not None:
            return refused
        try:
            _mark_started(running, self.inflight)  # no await since the deadline check above
            value = await task.fn(ctx, running.payload)
        except JobAborted:
            return lease  # the abort decides what is reported
        except Exception as exc:
            return failure_of(lease, task, exc)
        outcome, running.result = result_of(lease, task, value)
        return outcome

    async def _in_thread(self, running: Running) -> Outcome:
        """A sync attempt run for a task that awaits it (with tracing: the thread runs in a
        copy of this task's context, so a handler's own spans and the jobs it enqueues
        belong to the attempt's trace)."""
        waiter: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        job = SyncJob(running, self._cancel_sync, waiter)
        self._threads.submit(job)
        try:
            # Shielded: a task's cancel would cancel the very future it awaits, and the
            # thread's outcome must still be waited for after an abort (below).
            return await asyncio.shield(waiter)
        except asyncio.CancelledError:
            if self._threads.withdraw(job):
                job.finished = True  # no thread will run it: the abort (if any) is reported
                raise
            if not running.abort_cancel:
                # From outside (the worker or its loop ending): waiting for a thread that may
                # never end would hold that up for ever. Given up: nothing is reported.
                running.abandoned = job.finished = True
                raise
            running.abort_cancel = False
        # Aborted while its thread runs it: the soft stop, then wait for the thread to end.
        self._soft_stop(running)
        try:
            return await asyncio.shield(waiter)
        except asyncio.CancelledError:  # only from outside, as above
            running.abandoned = job.finished = True
            raise

    async def _check_joined_completion(
        self, running: Running, outcome: Lease | Failure
    ) -> Lease | Failure:
        """The handler joined the completion to its own transaction (``ctx.complete_in``):
        find out whether that transaction committed it."""
        lease = running.lease
        for _ in range(3):
            try:
                job = await self.client.get_job(lease.job_id)
                break
            except TRANSIENT as exc:
                await self._outage.failed("completion check", exc)
                await asyncio.sleep(self._outage.backoff())
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

    def _submit(self, running: Running, outcome: Lease | Failure) -> bool:
        """Hand the outcome to the completer; False when there is nothing to report."""
        lease, reason = running.lease, running.ctx.aborted
        if running.ctx.suspended:
            # A durable wait suspended the job in its own fenced transaction: the lease is
            # given back already, whatever the handler did after (see worker/waits.py).
            if jobs_log.isEnabledFor(logging.DEBUG):
                jobs_log.debug("job %d suspended", lease.job_id, extra=job_fields(lease))
            return False
        if reason is not None and not running.abort_counted:
            self.inflight.count_abort(running, reason)  # the handler's own ctx found it out
        if reason == ErrorCode.LEASE_LOST:
            if running.started_at is None:
                self.events.late_start()  # the lease ended before its handler could start
            return False  # someone else may own the job now: report nothing, ever
        if running.ctx.completed:
            # A fenced transaction already committed the completion with the handler's
            # writes; an error raised after that block changes nothing.
            self.events.committed_in_handler()
            return False
        if reason is not None:
            outcome = Failure(
                lease,
                reason,
                error_class=ErrorClass.TRANSIENT,
                detail=abort_detail(reason, running),
                policy=running.task_def.retry if running.task_def else None,
            )
        self.inflight.reported(running)
        self._completer.submit(
            outcome,
            result=running.result if isinstance(outcome, Lease) else None,
            deadline=running.deadline,
            on_done=lambda status: self._recorded(running, outcome, status),
        )
        return True

    def _recorded(
        self, running: Running, outcome: Lease | Failure, status: JobStatus | None
    ) -> None:
        self.inflight.forget(running)
        lease = running.lease
        if status is None:
            self.events.lost_fence("complete" if isinstance(outcome, Lease) else "fail")
            log.warning(
                "job %d: lease (token %d) was lost before its result was recorded; "
                "result discarded",
                lease.job_id,
                lease.token,
            )
            return
        self.events.finished(outcome, status)
        if isinstance(outcome, Lease):
            if jobs_log.isEnabledFor(logging.DEBUG):
                jobs_log.debug("job %d succeeded", lease.job_id, extra=job_fields(lease))
            return
        # At the default level (WARNING): a retry or a dead job is what an operator running
        # a worker in a terminal needs to see without -v, with the task it belongs to.
        jobs_log.warning(
            "job %d (task %s) %s after attempt %d: %s",
            lease.job_id,
            lease.task,
            "will be retried" if status is JobStatus.PENDING else str(status),
            lease.attempt,
            outcome.error_code,
            extra={**job_fields(lease), "status": str(status), "error_code": outcome.error_code},
        )


def _too_late(running: Running) -> bool:
    """The lease's local deadline passed before its handler could start: drop the attempt
    (as a lost lease: nothing is reported under it). Called from the loop or a pool thread;
    ``ctx.abort`` keeps the first reason, so a racing abort from the loop wins or loses
    cleanly."""
    if time.monotonic() < running.deadline:
        return False
    if running.ctx.abort(ErrorCode.LEASE_LOST):
        lease = running.lease
        log.warning(
            "job %d (token %d, task %s): lease ended before its handler could start; "
            "not started, nothing reported (a sweep recovers the job)",
            lease.job_id,
            lease.token,
            lease.task,
        )
    return True


def _sync_attempt(inflight: InFlight, running: Running) -> Outcome:
    """A whole sync attempt, in a pool thread. A job queued behind busy threads has not
    started yet: it counts as started (and so is charged, and waited for at shutdown) from
    the moment its handler is called. Its lease may have ended while it waited (the loop
    may not have noticed yet): checked last thing before the call."""
    lease, ctx, task = running.lease, running.ctx, running.task_def
    if task is None:  # only a task's own handlers come here; kept for the type
        return lease
    if ctx.aborted is not None or _too_late(running):
        return lease
    running.payload, refused = prepare_payload(task, lease)
    if refused is not None:
        return refused
    if ctx.aborted is not None or _too_late(running):
        return lease  # the check may have taken a while
    _mark_started(running, inflight)
    gate = running.gate
    try:
        try:
            if gate is not None and not gate.enter():
                return lease  # stopped before it could start: the abort decides
            value = task.fn(ctx, running.payload)
        finally:
            if gate is not None:
                gate.leave()  # from here on no soft stop can land in this thread
        # Inside the try: whatever escapes here would strand the job and its slot.
        outcome, running.result = result_of(lease, task, value)
        return outcome
    except JobAborted:  # HandlerStopped too
        return lease  # the abort decides what is reported
    except BaseException as exc:  # a thread has nobody to pass SystemExit & co. on to
        return failure_of(lease, task, exc)


def _mark_started(running: Running, inflight: InFlight) -> None:
    running.started_at = time.monotonic()
    running.ctx.mark_started()
    task = running.task_def
    if task is not None and task.max_runtime is not None:
        inflight.started(running, task.max_runtime)
