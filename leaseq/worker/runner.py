"""The worker's wiring: claim, run outside any transaction, renew, report — on one event loop.

``Worker`` builds the pieces and runs them until stopped; each piece lives in its own module:
- fetcher.py: claim rounds sized by free slots (plus a small prefetch), woken by NOTIFY
  (listener.py), a freed slot, or the poll interval.
- executor.py: one attempt per claimed lease; async handlers on the loop, sync ones in
  threads; never started under a lease that already ended.
- leases.py: the lease keeper (fenced renewal, local deadlines, max_runtime, NO_PROGRESS).
- completer.py: batched fenced completions and failures.
- maintenance.py: sweeper, priority aging, pruner and schedule ticker, as periodic services.
- inflight.py: the running-jobs table and the one event hook behind stats and metrics.
- stopping.py: ending the background tasks at exit (a cancel Python 3.11 lost is repeated).

This module owns the lifecycle: start-up, signals (first: stop claiming and wait up to
``shutdown_timeout``; second: abandon), the shutdown itself, and the exit codes.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence

from leaseq.app import App
from leaseq.client_async import AsyncClient
from leaseq.codes import ErrorCode
from leaseq.dsn import describe_dsn
from leaseq.metrics import UniqueConflictCollector, WorkerMetrics
from leaseq.metrics_http import ObservabilityServer
from leaseq.worker.completer import Completer
from leaseq.worker.config import WorkerConfig
from leaseq.worker.executor import Executor
from leaseq.worker.fetcher import Fetcher
from leaseq.worker.inflight import InFlight, WorkerEvents, WorkerStats, log
from leaseq.worker.leases import LeaseKeeper
from leaseq.worker.listener import Listener
from leaseq.worker.maintenance import services as maintenance_services
from leaseq.worker.outage import TRANSIENT, Outage
from leaseq.worker.stopping import stop_tasks

#: One line when a worker starts serving (the CLI shows it at any verbosity).
start_log = logging.getLogger("leaseq.start")

#: The start line names at most this many tasks, then says how many more.
_TASKS_SHOWN = 20


def serving_line(queues: Sequence[str], tasks: Sequence[str]) -> str:
    """The start line's tail: the queues served and the tasks this worker can run."""
    shown = sorted(tasks)[:_TASKS_SHOWN]
    more = len(tasks) - len(shown)
    names = ", ".join(shown) or "none"
    return f"queues: {', '.join(queues)}; tasks: {names}" + (f" and {more} more" if more else "")


__all__ = ["EXIT_ABANDONED", "EXIT_OK", "Worker", "WorkerStats", "exit_code", "run_worker"]

#: Exit codes of ``leaseq worker`` (see README): clean stop; jobs had to be abandoned.
EXIT_OK = 0
EXIT_ABANDONED = 3


class Worker:
    """One worker: runs ``app``'s handlers for the configured queues until stopped."""

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
            generic_plans=True,
        )
        self.stats = WorkerStats()
        self.outage = Outage(heal=self.client.check_connections)
        self.metrics = WorkerMetrics()
        self.metrics.registry.register(UniqueConflictCollector(app.unique_conflicts))
        self.metrics_port: int | None = None
        self._events = WorkerEvents(self.stats, self.metrics)
        self._inflight = InFlight(self._events)
        self._watch_gauges()
        self._wake = asyncio.Event()
        self._stopping = asyncio.Event()
        self._forced = False
        self._signals = 0
        self._completer = Completer(self.client, outage=self.outage)
        self._executor = Executor(
            app, self.config, self.client, self._inflight, self._completer, self.outage
        )
        self._fetcher = Fetcher(
            self.config,
            self.client,
            self._inflight,
            self._events,
            self.outage,
            start=self._executor.start,
            stopping=self._stopping,
            wake=self._wake,
        )
        self._keeper = LeaseKeeper(self.config, self.client, self._inflight, self.outage)
        policies = {name: t.retry for name, t in app.tasks.items() if t.retry is not None}
        self._maintenance = maintenance_services(
            self.config, self.client, self.outage, self._events, policies
        )

    def _watch_gauges(self) -> None:
        """Gauges read on scrape (from the metrics thread: plain reads, no locking needed)."""
        m = self.metrics
        m.slots.set(self.config.concurrency)
        m.busy_slots.set_function(self._inflight.busy)
        m.held_leases.set_function(lambda: len(self._inflight))
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
        return len(self._inflight)

    # -- lifecycle --------------------------------------------------------------------

    def stop(self) -> None:
        """Stop claiming; running jobs finish (up to shutdown_timeout) and the loop exits."""
        self._stopping.set()
        self._wake.set()
        self._inflight.slot_freed.set()

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
                len(self._inflight),
            )
            self.stop()
        else:
            log.warning("second signal: abandoning running jobs and exiting now")
            self.stop_now()

    async def _sync_schedules(self) -> None:
        """Store the app's declared schedules; disable its tasks' undeclared code ones."""
        refused, disabled = await self.client.sync_code_schedules(
            self.app.schedule_defs(), self.app.tasks, actor=f"worker:{self.worker_id}"
        )
        for name in refused:
            log.warning("schedule %r is a dynamic schedule in the database; not replaced", name)
        for name in disabled:
            log.info("schedule %r is no longer declared in code: disabled", name)

    async def run(self, *, install_signal_handlers: bool = False) -> WorkerStats:
        """Run until stopped (or, in burst/drain mode, until there is no more work)."""
        await self.client.check_schema()
        for declared in self.app.tasks.values():
            # The tasks' declared limits, stored so every worker obeys the same values.
            if declared.limit is not None:
                name, concurrency, rate = declared.limit
                actor = f"worker {self.worker_id}"
                await self.client.declare_limit(
                    name, concurrency=concurrency, rate=rate, actor=actor
                )
        # Said once the database answered and its schema fits: which database this serves.
        start_log.info(
            "worker serving %s (schema %s); %s",
            describe_dsn(await self.client.dsn()),
            self.app.schema,
            serving_line(self.config.queue_names, list(self.app.tasks)),
        )
        if self.config.schedules:
            await self._sync_schedules()
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
            asyncio.create_task(self._keeper.run(), name="leaseq-lease-keeper"),
        ]
        for service in self._maintenance:
            name = f"leaseq-{service.name.replace(' ', '-')}"
            background.append(asyncio.create_task(service.run(), name=name))
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
            await self._fetcher.run()
            await self._shutdown()
            if self.config.burst and not self._stopping.is_set():
                with contextlib.suppress(*TRANSIENT):
                    held = await self.client.held_jobs(self.config.queue_names)
                    self.stats.left_paused, self.stats.left_held = held
        finally:
            try:
                await stop_tasks(background, patience=self.config.op_timeout)
            finally:  # also when the worker itself is cancelled meanwhile
                if install_signal_handlers:
                    for sig in (signal.SIGTERM, signal.SIGINT):
                        loop.remove_signal_handler(sig)
                await self.client.close()
                await self._executor.close()
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
        inflight = self._inflight
        # A sync job a handler thread has already taken cannot be withdrawn (its cancel
        # says so): it counts as running, and its lease is not released under it.
        unstarted = [
            r
            for r in inflight.all()
            if r.started_at is None and (r.task is None or r.task.cancel())
        ]
        for running in unstarted:
            # A task cancelled before its first step never runs its own cleanup.
            inflight.forget(running)
        if unstarted:
            with contextlib.suppress(*TRANSIENT):
                async with asyncio.timeout(self.config.op_timeout):
                    released = await self.client.release_many([r.lease for r in unstarted])
                    self._events.released(len(released))
                    log.info("released %d unstarted lease(s)", len(released))
        deadline = time.monotonic() + self.config.shutdown_timeout
        while inflight and not self._forced and time.monotonic() < deadline:
            inflight.slot_freed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(inflight.slot_freed.wait(), deadline - time.monotonic())
        left = [r for r in inflight.all() if r.started_at is not None]
        if left:
            log.warning("abandoning %d running job(s) at shutdown; they will be retried", len(left))
            self.stats.abandoned_at_shutdown = len(left)
            for running in left:
                inflight.abort(running, ErrorCode.WORKER_SHUTDOWN)
            # Give the fenced failure reports a moment; whatever does not make it expires.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(min(5.0, self.config.op_timeout)):
                    while inflight:
                        inflight.slot_freed.clear()
                        await inflight.slot_freed.wait()


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

    with collector_tuned():
        return asyncio.run(main())


#: The cyclic collector's youngest-generation threshold while ``run_worker`` runs (Python's
#: default is 700 allocations).
GC_YOUNG_THRESHOLD = 10_000


@contextlib.contextmanager
def collector_tuned() -> Iterator[None]:
    """Python's cyclic garbage collector, set for a worker process, and put back after.

    Each job allocates a dozen or so tracked objects (its task, coroutine, context, lease),
    which set off a young collection every few dozen jobs and, as survivors pile up, full
    collections that walk every object the imports left behind (some 150,000 with the
    app, psycopg and leaseq loaded). Measured in a 20,000-job drain: about 300 young and 2
    full collections, 0.3-0.5 s of a 1.3 s run. So the objects alive at start-up are
    frozen (no collection looks at them again) and young collections wait for 10,000
    allocations; a job's own objects are mostly freed by reference counting first."""
    threshold = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(GC_YOUNG_THRESHOLD, *threshold[1:])
    try:
        yield
    finally:
        gc.set_threshold(*threshold)
        gc.unfreeze()


def exit_code(stats: WorkerStats) -> int:
    return EXIT_ABANDONED if stats.abandoned_at_shutdown else EXIT_OK
