"""One worker process serving queues on several databases: one :class:`Worker` per database.

``leaseq worker --queue-dsn emails=DSN_B`` (or ``App(queues=...)``) puts queues on other
databases than the app's DSN (``leaseq.rules.routing.QueueMap``). This runs, on one event loop,
one ordinary worker per database with the configured queues that live there: each has its
own client, leases, sweeper, ticker and LISTEN connection on its database, and the options
(``--concurrency`` included) apply to each. A signal stops them all; the process exits once
each has shut down. Each worker stores and ticks only the app's schedules whose queue is on
its database, so a periodic job is enqueued where its queue is served.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import signal
from collections.abc import Awaitable, Callable

from leaseq.app import App
from leaseq.dsn import describe_dsn
from leaseq.errors import ConfigError, LeaseqError
from leaseq.rules.routing import QueueMap
from leaseq.worker.config import WorkerConfig
from leaseq.worker.inflight import WorkerStats
from leaseq.worker.runner import Worker


def queue_map_of(app: App) -> QueueMap:
    """The app's queues on other databases, with the app's DSN as the default."""
    return QueueMap(app.queue_dsns, default=app.dsn)


def app_for(app: App, queue_map: QueueMap, dsn: str | None) -> App:
    """A view of ``app`` on one database: its DSN, and only the schedules of its queues.
    Tasks stay the app's own, so a handler's enqueue is still routed by queue."""
    view = copy.copy(app)
    view._dsn = dsn  # not the setter: it would close the clients the copy shares with app
    queues = {d.name: d.queue for d in app.schedule_defs()}
    view.schedules = {
        name: spec for name, spec in app.schedules.items() if queue_map.dsn_for(queues[name]) == dsn
    }
    view._client = None
    view._async_client = None
    return view


def plan(app: App, config: WorkerConfig) -> list[Worker]:
    """One worker per database that holds some of ``config``'s queues."""
    queue_map = queue_map_of(app)
    groups = queue_map.split(config.queue_names)
    if len(groups) > 1 and config.metrics_port is not None:
        raise ConfigError(
            "--metrics-port serves one worker's metrics: with queues on several databases, "
            "run one worker command per database to scrape each"
        )
    if len(groups) > 1 and config.listen_dsn is not None:
        raise ConfigError("--listen-dsn names one database: not with queues on several")
    workers = []
    for dsn, names in groups.items():
        queues = tuple(q for q in config.queue_settings if q.name in names)
        workers.append(
            Worker(app_for(app, queue_map, dsn), dataclasses.replace(config, queues=queues))
        )
    return workers


def _combined(all_stats: list[WorkerStats]) -> WorkerStats:
    total = WorkerStats()
    for stats in all_stats:
        for spec in dataclasses.fields(WorkerStats):
            mine, theirs = getattr(total, spec.name), getattr(stats, spec.name)
            if isinstance(mine, dict):
                for key, n in theirs.items():
                    mine[key] = mine.get(key, 0) + n
            elif isinstance(mine, int | float):
                setattr(total, spec.name, mine + theirs)
    return total


async def _named(worker: Worker, exc: LeaseqError) -> LeaseqError:
    """``exc`` with the worker's database in its message (as it is if it cannot be)."""
    where = describe_dsn(await worker.client.dsn())
    try:
        return type(exc)(f"{exc} (database {where})")
    except TypeError:  # an error class with arguments of its own
        return exc


async def _preflight(workers: list[Worker]) -> None:
    """Every database answers and its schema fits, before any worker starts: a failed start
    stays one line, naming the database, with nothing claimed anywhere."""
    for worker in workers:
        try:
            await worker.client.check_schema()
        except LeaseqError as exc:
            for each in workers:
                await each.client.close()
            raise await _named(worker, exc) from None


def run_workers(
    app: App,
    config: WorkerConfig,
    *,
    install_signal_handlers: bool = True,
    on_ready: Callable[[list[Worker]], Awaitable[None]] | None = None,
) -> WorkerStats:
    """Run one worker per database of ``config``'s queues until they all stop; returns
    their counters added up. SIGTERM/SIGINT stop them all (a second one: at once)."""

    async def main() -> WorkerStats:
        workers = plan(app, config)
        signals = 0

        def on_signal() -> None:
            nonlocal signals
            signals += 1
            for worker in workers:
                (worker.stop if signals == 1 else worker.stop_now)()

        loop = asyncio.get_running_loop()
        if install_signal_handlers:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, on_signal)
        try:
            if on_ready is not None:
                await on_ready(workers)
            if len(workers) > 1:
                await _preflight(workers)
            runs = [asyncio.create_task(worker.run()) for worker in workers]
            try:
                done = await asyncio.gather(*runs)
            except BaseException:
                for worker in workers:  # one failed: the others stop too
                    worker.stop_now()
                await asyncio.gather(*runs, return_exceptions=True)
                raise
            return _combined(list(done))
        finally:
            if install_signal_handlers:
                for sig in (signal.SIGTERM, signal.SIGINT):
                    loop.remove_signal_handler(sig)

    return asyncio.run(main())
