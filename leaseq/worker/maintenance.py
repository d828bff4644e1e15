"""Periodic maintenance services: sweeper, priority aging, pruner, fair key pruner and
vacuum, schedule ticker, and the payload store's upkeep.

Each is a ``PeriodicService``: run ``tick()`` every ``interval`` seconds, each statement
bounded by ``timeout``, database outages reported through the shared ``Outage`` (one log
line per outage) and retried at the next tick. All are safe to run in every worker at once.
A new periodic duty is one more subclass.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from psycopg import AsyncConnection

from leaseq.client_async import AsyncClient
from leaseq.errors import DatabaseUnavailable
from leaseq.retry import RetryPolicy
from leaseq.worker.config import WorkerConfig
from leaseq.worker.inflight import WorkerEvents
from leaseq.worker.outage import TRANSIENT, Outage

log = logging.getLogger("leaseq.worker")

#: Longest a ticker sleeps: a schedule added, changed or enabled at run time is seen
#: within this (the ticker otherwise wakes at the earliest next tick).
TICKER_MAX_WAIT = 1.0
#: Shortest: when a due schedule is held by another ticker, do not spin on it.
TICKER_MIN_WAIT = 0.01
#: Schedules handled per ticker round (each its own transaction) before the next sleep.
TICKER_BATCH = 100

#: Rows per retention batch: small, so each delete holds its locks and WAL burst briefly.
PRUNE_BATCH = 1000

#: How often a worker looks at fair_keys' dead rows, and how many make it vacuum the table:
#: a claim of a fair queue steps over ~1,000 dead pass entries in 7 index pages. Every half
#: second: a worker's drain over 10,000 keys ran 2% faster than with every second (5,636
#: against 5,522 jobs/s, 4 interleaved rounds), and no faster with every quarter.
FAIR_VACUUM_EVERY = 0.5
FAIR_VACUUM_DEAD = 1000


class PeriodicService:
    """Runs ``tick`` forever: first after ``first_delay``, then every ``interval``."""

    #: What the outage log calls a failed tick.
    name = "maintenance"

    def __init__(
        self,
        client: AsyncClient,
        outage: Outage,
        *,
        interval: float,
        timeout: float,
        first_delay: float = 0.0,
    ) -> None:
        self.client = client
        self.outage = outage
        self.interval = interval
        self.timeout = timeout
        self.first_delay = first_delay

    async def run(self) -> None:
        await asyncio.sleep(self.first_delay)
        while True:
            try:
                await self.tick()
            except TRANSIENT as exc:
                await self.outage.failed(self.name, exc)
            await asyncio.sleep(self.interval)

    async def tick(self) -> None:
        raise NotImplementedError


class Sweeper(PeriodicService):
    """Recovers expired leases of any worker (requeued, dead or cancelled by policy)."""

    name = "sweep"

    def __init__(
        self,
        client: AsyncClient,
        outage: Outage,
        events: WorkerEvents,
        *,
        actor: str,
        policies: dict[str, RetryPolicy],
        interval: float,
        timeout: float,
    ) -> None:
        super().__init__(client, outage, interval=interval, timeout=timeout)
        self.events = events
        self.actor = actor
        self.policies = policies

    async def tick(self) -> None:
        async with asyncio.timeout(self.timeout):
            result = await self.client.sweep(actor=self.actor, policies=self.policies)
        self.events.swept(result)
        if result.total:
            log.info(
                "sweeper recovered %d expired lease(s): %d requeued, %d dead",
                result.total,
                result.requeued,
                result.dead,
            )


class PriorityAging(PeriodicService):
    """Raises the priority of claimable jobs by one per ``aging`` seconds waited. Aging moves
    in whole intervals, so a look a few times per interval keeps the bound tight without
    rescanning the backlog too often."""

    name = "priority aging"

    def __init__(
        self, client: AsyncClient, outage: Outage, *, aging: float, every: float, timeout: float
    ) -> None:
        super().__init__(client, outage, interval=every, timeout=timeout)
        self.aging = aging

    async def tick(self) -> None:
        async with asyncio.timeout(self.timeout):
            await self.client.age_priorities(interval=self.aging)


class Pruner(PeriodicService):
    """Retention: every interval, prune until nothing is left to prune, in small batches
    paced so that deleting takes at most ``share`` of the time. A fixed number of batches
    per interval (ten, at first) fell behind any sustained load: at 3,000 jobs/s the table
    grew without end (python -m bench.sustained)."""

    name = "prune"

    def __init__(
        self,
        client: AsyncClient,
        outage: Outage,
        *,
        retention: float,
        share: float,
        interval: float,
        timeout: float,
    ) -> None:
        super().__init__(client, outage, interval=interval, timeout=timeout, first_delay=interval)
        self.retention = retention
        self.share = share

    async def tick(self) -> None:
        pruned = 0
        try:
            while True:
                started = time.monotonic()
                async with asyncio.timeout(self.timeout):
                    done = await self.client.prune(
                        older_than=self.retention, batch_size=PRUNE_BATCH, max_batches=1
                    )
                pruned += done
                if done < PRUNE_BATCH:
                    break
                spent = time.monotonic() - started
                await asyncio.sleep(spent * (1 / self.share - 1))
        finally:
            if pruned:
                log.info("pruned %d finished job(s) older than %gs", pruned, self.retention)
        # Schedule tick rows age out with the jobs (a tick is never inserted twice anyway:
        # its schedule's next tick has moved past it).
        while True:
            async with asyncio.timeout(self.timeout):
                done = await self.client.prune_schedule_ticks(
                    older_than=self.retention, batch_size=PRUNE_BATCH
                )
            if done < PRUNE_BATCH:
                break
        # So does the HTTP API's request trail (one row per request answered).
        while True:
            async with asyncio.timeout(self.timeout):
                done = await self.client.prune_api_requests(
                    older_than=self.retention, batch_size=PRUNE_BATCH
                )
            if done < PRUNE_BATCH:
                break


class FairKeyPruner(PeriodicService):
    """Deletes fair queues' keys idle for ``retention`` seconds with no job left, in batches,
    every interval (leaseq_fair_keys_pruned_total). A key that gets a job again is created
    again by that job's statement; the delete never takes a key changed since it read it."""

    name = "fair key prune"

    def __init__(
        self,
        client: AsyncClient,
        outage: Outage,
        events: WorkerEvents,
        *,
        retention: float,
        interval: float,
        timeout: float,
    ) -> None:
        super().__init__(client, outage, interval=interval, timeout=timeout, first_delay=interval)
        self.events = events
        self.retention = retention

    async def tick(self) -> None:
        while True:
            async with asyncio.timeout(self.timeout):
                done = await self.client.prune_fair_keys(
                    older_than=self.retention, batch_size=PRUNE_BATCH
                )
            self.events.fair_keys_pruned(done)
            if done < PRUNE_BATCH:
                break


class FairKeyVacuum(PeriodicService):
    """Vacuums ``fair_keys`` once it holds ``FAIR_VACUUM_DEAD`` dead row versions, looked at
    every ``FAIR_VACUUM_EVERY`` seconds (one read of the table's statistics) while this
    worker claims a fair queue; a worker of plain queues does nothing and holds no
    connection for it. Each claim of a fair queue leaves the old pass entries
    of the keys it took from at the low end of fair_keys_pass_idx, where the next claim's
    scan starts, so the claim slows with every one until a vacuum; autovacuum's minute is
    far too long for that (leaseq_fair_keys_vacuums_total).

    On a connection of its own, kept open: a look every second through the pool kept one
    more pooled connection in the rotation of the claims and completions, and cost the
    worker's drain of a fair queue 8% (bench.fairness, the worker rounds) where the same
    vacuums from outside the worker made it 6% faster."""

    name = "fair key vacuum"

    def __init__(
        self, client: AsyncClient, outage: Outage, events: WorkerEvents, *, timeout: float
    ) -> None:
        super().__init__(client, outage, interval=FAIR_VACUUM_EVERY, timeout=timeout)
        self.events = events
        self._conn: AsyncConnection[Any] | None = None

    async def run(self) -> None:
        try:
            await super().run()
        finally:
            await self._drop()

    async def tick(self) -> None:
        if not self.client.claims_fair_queues():
            # A worker of plain queues holds no connection for this and asks nothing (the
            # workers that claim the fair queues vacuum them; autovacuum backs them up).
            await self._drop()
            return
        try:
            async with asyncio.timeout(self.timeout):
                if self._conn is None or self._conn.closed:
                    self._conn = await self.client.connect(autocommit=True)
                vacuumed = await self.client.vacuum_fair_keys(
                    min_dead=FAIR_VACUUM_DEAD, connection=self._conn
                )
        except DatabaseUnavailable as exc:
            await self.outage.failed(self.name, exc)
            return
        except BaseException:
            await self._drop()  # a statement cut short leaves nothing to reuse
            raise
        if vacuumed:
            self.events.fair_keys_vacuumed()

    async def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            await conn.close()


class Ticker(PeriodicService):
    """Enqueues the due ticks of periodic schedules, in every worker at once if need be:
    each due schedule is handled in one transaction under its row lock (tickers skip each
    other's rows), and each tick's job is inserted with its unique tick row, so a tick
    makes one job however many tickers saw it. Sleeps until the earliest next tick, at
    most ``TICKER_MAX_WAIT``."""

    name = "schedule ticker"

    def __init__(
        self, client: AsyncClient, outage: Outage, events: WorkerEvents, *, timeout: float
    ) -> None:
        super().__init__(client, outage, interval=TICKER_MAX_WAIT, timeout=timeout)
        self.events = events
        self._wait = TICKER_MAX_WAIT

    async def run(self) -> None:
        while True:
            try:
                await self.tick()
            except TRANSIENT as exc:
                await self.outage.failed(self.name, exc)
                self._wait = TICKER_MAX_WAIT
            except Exception:
                # Logged and retried: a ticker that died quietly would stop every schedule
                # once all workers' tickers had met the same row.
                log.exception("schedule ticker round failed; retrying")
                self._wait = TICKER_MAX_WAIT * 5
            await asyncio.sleep(self._wait)

    async def tick(self) -> None:
        async with asyncio.timeout(self.timeout):
            result = await self.client.tick_schedules(limit=TICKER_BATCH)
        self.events.ticked(result)
        if result.parked:
            log.error(
                "schedules: disabled %d schedule(s) whose ticks cannot be computed; "
                "see `leaseq schedules list` and the admin_events table",
                result.parked,
            )
        if result.skipped_catch_up:
            log.info(
                "schedules: %d missed tick(s) left out by their catch-up policy",
                result.skipped_catch_up,
            )
        if result.schedules >= TICKER_BATCH:
            self._wait = 0.0
        elif result.next_in is None:
            self._wait = TICKER_MAX_WAIT
        else:
            self._wait = min(max(result.next_in, TICKER_MIN_WAIT), TICKER_MAX_WAIT)


class PayloadUpkeep(PeriodicService):
    """The payload store's upkeep (docs/payloads.md): deletes the objects whose jobs were
    pruned or purged (retried until the store confirms), and removes what no job names
    (rows of jobs deleted by hand, objects of enqueues that died between upload and
    commit) once older than ``ORPHAN_GRACE``. Counted in leaseq_payload_objects_deleted_total
    and leaseq_payload_orphans_removed_total."""

    name = "payload upkeep"

    def __init__(
        self,
        client: AsyncClient,
        outage: Outage,
        events: WorkerEvents,
        *,
        interval: float,
        timeout: float,
    ) -> None:
        super().__init__(client, outage, interval=interval, timeout=timeout, first_delay=interval)
        self.events = events
        self._last_orphan_sweep = 0.0

    async def tick(self) -> None:
        while True:
            async with asyncio.timeout(self.timeout):
                deleted = await self.client.delete_payload_objects(limit=500)
            self.events.payload_objects_deleted(deleted)
            if deleted < 500:
                break
        if time.monotonic() - self._last_orphan_sweep >= ORPHAN_SWEEP_EVERY:
            async with asyncio.timeout(self.timeout):
                removed = await self.client.sweep_orphan_payloads()
            self._last_orphan_sweep = time.monotonic()
            self.events.payload_orphans_removed(removed)


#: How often the orphan sweep lists the payload store (a listing is a request per 1,000
#: objects).
ORPHAN_SWEEP_EVERY = 600.0


def services(
    config: WorkerConfig,
    client: AsyncClient,
    outage: Outage,
    events: WorkerEvents,
    policies: dict[str, RetryPolicy],
) -> list[PeriodicService]:
    """The maintenance services a worker with this configuration runs."""
    timeout = max(config.op_timeout, 30.0)
    found: list[PeriodicService] = [
        Sweeper(
            client,
            outage,
            events,
            actor=f"sweeper:{config.worker_id}",
            policies=policies,
            interval=config.sweep_interval,
            timeout=timeout,
        )
    ]
    if config.priority_aging is not None:
        # Checked with the sweeps, at most four times per aging interval.
        every = max(config.priority_aging / 4, config.sweep_interval)
        found.append(
            PriorityAging(client, outage, aging=config.priority_aging, every=every, timeout=timeout)
        )
    if config.schedules:
        found.append(Ticker(client, outage, events, timeout=timeout))
    if client.offload_above is not None:
        found.append(
            PayloadUpkeep(client, outage, events, interval=config.sweep_interval, timeout=timeout)
        )
    if config.retention is not None:
        found.append(
            Pruner(
                client,
                outage,
                retention=config.retention,
                share=config.prune_share,
                interval=config.prune_interval,
                timeout=timeout,
            )
        )
    found.append(FairKeyVacuum(client, outage, events, timeout=timeout))
    if config.fair_key_retention is not None:
        found.append(
            FairKeyPruner(
                client,
                outage,
                events,
                retention=config.fair_key_retention,
                interval=config.prune_interval,
                timeout=timeout,
            )
        )
    return found
