"""The worker: claim, run outside any transaction, renew, report — on one event loop.

Pieces, each a coroutine:
- fetch loop: claims in batches sized by free slots, then sleeps until woken (NOTIFY,
  a freed slot) or the poll interval passes; the poll always runs.
- job runners: one per claimed lease; async handlers on the loop, sync ones in threads.
- heartbeater: one fenced statement per tick renews every in-flight lease; a lease missing
  from the result is lost: its handler is cancelled (async) or told through ``ctx``.
- completer: batches fenced completions and failures (see completer.py).
- sweeper: recovers expired leases of any worker; safe to run in every worker at once.
- listener: LISTEN connection that only sets the wake-up event.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
import traceback
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import psycopg

from leaseq.app import App, Task
from leaseq.client_async import AsyncClient
from leaseq.errors import Permanent, Retry
from leaseq.models import Failure, Lease
from leaseq.worker.completer import Completer
from leaseq.worker.config import WorkerConfig
from leaseq.worker.context import JobContext, LeaseLost
from leaseq.worker.listener import Listener

log = logging.getLogger("leaseq.worker")

UNKNOWN_TASK = "UNKNOWN_TASK"


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
    by_error: dict[str, int] = field(default_factory=dict)


@dataclass
class _Running:
    lease: Lease
    ctx: JobContext
    task: asyncio.Task[None] | None = None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:200] if text else type(exc).__name__


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
            schema=app.schema,
            retry_policy=app.retry_policy,
            pool_size=4,
            application_name="leaseq-worker",
        )
        self.stats = WorkerStats()
        # Keyed by (job id, token): after a lease loss this worker may reclaim the same job
        # while its stale attempt is still winding down; the two must not be confused.
        self._running: dict[tuple[int, int], _Running] = {}
        self._wake = asyncio.Event()
        self._slot_freed = asyncio.Event()
        self._stopping = asyncio.Event()
        self._completer = Completer(self.client)
        self._threads = ThreadPoolExecutor(
            max_workers=self.config.concurrency, thread_name_prefix="leaseq-job"
        )
        self._signals = 0

    @property
    def worker_id(self) -> str:
        return self.config.worker_id

    # -- lifecycle --------------------------------------------------------------------

    def stop(self) -> None:
        """Stop claiming; running jobs finish (up to shutdown_timeout) and the loop exits."""
        self._stopping.set()
        self._wake.set()

    def _on_signal(self) -> None:
        self._signals += 1
        if self._signals == 1:
            log.info("shutdown requested: finishing %d running job(s)", len(self._running))
            self.stop()
        else:
            log.warning("second signal: exiting now; unfinished leases will expire")
            for running in list(self._running.values()):
                if running.task is not None:
                    running.task.cancel()

    async def run(self, *, install_signal_handlers: bool = False) -> WorkerStats:
        """Run until stopped (or, in burst/drain mode, until there is no more work)."""
        await self.client.check_schema()
        loop = asyncio.get_running_loop()
        if install_signal_handlers:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self._on_signal)
        background = [
            asyncio.create_task(self._completer.run(), name="leaseq-completer"),
            asyncio.create_task(self._heartbeat_loop(), name="leaseq-heartbeat"),
            asyncio.create_task(self._sweep_loop(), name="leaseq-sweeper"),
        ]
        if self.config.listen:
            listener = Listener(self.client, frozenset(self.config.queues), self._wake)
            background.append(asyncio.create_task(listener.run(), name="leaseq-listener"))
        log.info(
            "worker %s started: queues=%s concurrency=%d lease=%gs",
            self.worker_id,
            ",".join(self.config.queues),
            self.config.concurrency,
            self.config.lease_seconds,
        )
        try:
            await self._fetch_loop()
            await self._wait_running(self.config.shutdown_timeout)
            await self._wait_completer()
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
        log.info(
            "worker %s stopped: %d succeeded, %d failed, %d lost",
            self.worker_id,
            self.stats.succeeded,
            self.stats.failed,
            self.stats.lost_leases,
        )
        return self.stats

    async def _wait_running(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self._running and time.monotonic() < deadline:
            self._slot_freed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._slot_freed.wait(), deadline - time.monotonic())
        if self._running:
            log.warning(
                "%d job(s) still running after %gs; their leases will expire and be retried",
                len(self._running),
                timeout,
            )
            for running in self._running.values():
                if running.task is not None:
                    running.task.cancel()

    async def _wait_completer(self) -> None:
        for _ in range(200):
            if self._completer.idle():
                return
            await asyncio.sleep(0.01)

    # -- fetching ---------------------------------------------------------------------

    async def _fetch_loop(self) -> None:
        cfg = self.config
        backoff = 0.1
        while not self._stopping.is_set():
            free = cfg.concurrency - len(self._running)
            if free <= 0:
                self._slot_freed.clear()
                await self._slot_freed.wait()
                continue
            self._wake.clear()
            try:
                claimed, exhausted = await self._claim_round(free)
                backoff = 0.1
            except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
                log.warning("claim failed (%s); retrying in %.1fs", _first_line(exc), backoff)
                await self._sleep_or_wake(backoff)
                backoff = min(backoff * 2, 10.0)
                continue
            if claimed and not exhausted:
                continue  # more may be waiting: go again at once
            if not claimed and not self._running and await self._finished():
                return
            await self._sleep_or_wake(cfg.poll_interval)

    async def _claim_round(self, free: int) -> tuple[int, bool]:
        """Claim from each queue in turn until slots are full; (claimed, all queues empty)."""
        claimed = 0
        exhausted = True
        for queue in self.config.queues:
            want = min(free - claimed, self.config.batch_size)
            if want <= 0:
                exhausted = False
                break
            leases = await self.client.claim(
                queue,
                worker=self.worker_id,
                lease_seconds=self.config.lease_seconds,
                limit=want,
            )
            self.stats.claimed += len(leases)
            for lease in leases:
                self._start(lease)
            claimed += len(leases)
            if len(leases) == want:
                exhausted = False
        return claimed, exhausted

    async def _finished(self) -> bool:
        """In burst mode: nothing claimable now. In drain mode: nothing left at all."""
        if self.config.drain:
            return not await self.client.queues_have_work(self.config.queues)
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

    def _start(self, lease: Lease) -> None:
        ctx = JobContext(lease, self.worker_id)
        running = _Running(lease, ctx)
        self._running[(lease.job_id, lease.token)] = running
        running.task = asyncio.create_task(
            self._run_job(running), name=f"leaseq-job-{lease.job_id}"
        )

    async def _run_job(self, running: _Running) -> None:
        lease, ctx = running.lease, running.ctx
        try:
            outcome = await self._execute(lease, ctx)
            if ctx.lease_lost:
                # The renewal already found the lease gone: whatever the handler returned,
                # someone else owns the job now, so nothing is reported.
                return
            ok = await self._completer.report(outcome)
            if ok:
                if isinstance(outcome, Lease):
                    self.stats.succeeded += 1
                else:
                    self.stats.failed += 1
                    code = outcome.error_code
                    self.stats.by_error[code] = self.stats.by_error.get(code, 0) + 1
            else:
                self.stats.lost_fence_writes += 1
                log.warning(
                    "job %d: lease (token %d) was lost before its result was recorded; "
                    "result discarded",
                    lease.job_id,
                    lease.token,
                )
        except asyncio.CancelledError:
            if not ctx.lease_lost:
                raise
        finally:
            self._running.pop((lease.job_id, lease.token), None)
            self._slot_freed.set()

    async def _execute(self, lease: Lease, ctx: JobContext) -> Lease | Failure:
        task = self.app.tasks.get(lease.task)
        if task is None:
            return Failure(
                lease,
                UNKNOWN_TASK,
                retryable=False,
                detail=f"no handler registered for task {lease.task!r} in this worker's app",
            )
        try:
            await self._call(task, ctx, lease.payload)
        except Permanent as exc:
            return Failure(lease, exc.code, retryable=False, detail=exc.detail)
        except Retry as exc:
            return Failure(
                lease, exc.code, retryable=True, detail=exc.detail, retry_in=exc.retry_in
            )
        except LeaseLost:
            return lease  # ignored by the caller: ctx.lease_lost is set
        except Exception as exc:
            detail = "".join(traceback.format_exception(exc))
            return Failure(lease, type(exc).__name__, retryable=True, detail=detail)
        return lease

    async def _call(self, task: Task, ctx: JobContext, payload: Any) -> None:
        if task.is_async:
            await task.fn(ctx, payload)
        else:
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(self._threads, task.fn, ctx, payload)

    # -- heartbeats and sweeping ------------------------------------------------------

    async def _heartbeat_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.renew_every)
            await self._renew_all()

    async def _renew_all(self) -> None:
        current = list(self._running.values())
        if not current:
            return
        try:
            result = await self.client.heartbeat_many(
                [r.lease for r in current], lease_seconds=self.config.lease_seconds
            )
        except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
            self.stats.heartbeat_failures += 1
            log.warning("lease renewal failed (%s); will retry next tick", _first_line(exc))
            return
        for running in current:
            key = (running.lease.job_id, running.lease.token)
            if key in result.lost:
                if key in self._running and not running.ctx.lease_lost:
                    self._lose(running)
            elif key[0] in result.cancel_requested:
                running.ctx.mark_cancel_requested()

    def _lose(self, running: _Running) -> None:
        running.ctx.mark_lost()
        self.stats.lost_leases += 1
        log.warning(
            "job %d: lease (token %d) lost; stopping its handler, its result will not be reported",
            running.lease.job_id,
            running.lease.token,
        )
        task = self.app.tasks.get(running.lease.task)
        if task is not None and task.is_async and running.task is not None:
            running.task.cancel()

    async def _sweep_loop(self) -> None:
        actor = f"sweeper:{self.worker_id}"
        while True:
            try:
                result = await self.client.sweep(actor=actor)
                self.stats.swept_requeued += result.requeued
                self.stats.swept_dead += result.dead
                if result.total:
                    log.info(
                        "sweeper recovered %d expired lease(s): %d requeued, %d dead",
                        result.total,
                        result.requeued,
                        result.dead,
                    )
            except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
                log.warning("sweep failed (%s); will retry", _first_line(exc))
            await asyncio.sleep(self.config.sweep_interval)


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
