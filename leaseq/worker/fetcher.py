"""Claim rounds: how many leases to take, from which queues, and when.

The primary claimer claims whenever slots are free, then sleeps until woken (NOTIFY, a freed
slot) or the poll interval passes; the poll always runs. While the queues are busy (the last
claim came back full) up to ``claims_in_flight - 1`` helper claimers run extra claims on
their own connections: one claim at a time would cap a worker at one batch per round trip.
Each round splits the free slots between the queues by weight (``WeightedShares``); slots
promised to a claim in flight are reserved so that claimers do not over-claim.

After a round that came back short, the fetcher asks (``claim_wait``) how long a rate limit
holds its queues back, and sleeps until then rather than the whole poll interval: a bucket
sends no wake-up when its next token frees up. Jobs held back by a concurrency limit are
claimed when this worker frees a slot, on a wake-up, or at the next poll.

With ``adaptive_batch`` the claim size is not fixed: each claim's size and time feed a fit
of its fixed and per-job cost (``leaseq.rules.batching``), and the next claims ask for the
size that amortises the fixed part (the round trip, the commit), up to the claim limit; the
worker then also holds up to that many leases beyond its slots (bounded by its concurrency),
so a claim of that size can be taken while the slots run. A queue's own ``batch=N`` stays
fixed. Every job still has its own fenced lease, renewed by the lease keeper.

A claim that fails on bad *data* (a row the statement or its decoding cannot handle) is
logged, counted, and its queue backed off; the other queues keep being claimed. Outages
are the primary claimer's to report; any other error stops the worker.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import psycopg

from leaseq import validate
from leaseq.client_async import AsyncClient
from leaseq.models import Lease
from leaseq.rules.batching import ClaimCost, claim_size
from leaseq.worker.config import QueueSettings, WorkerConfig
from leaseq.worker.fairness import WeightedShares
from leaseq.worker.inflight import InFlight, WorkerEvents
from leaseq.worker.outage import TRANSIENT, Outage, first_line

log = logging.getLogger("leaseq.worker")

#: Errors of a claim that mean "a row is bad", not "the database is gone" or "leaseq has a
#: bug": the statement failed on a value (e.g. an int4 overflow), or decoding its rows did.
CLAIM_DATA_ERRORS: tuple[type[BaseException], ...] = (
    psycopg.DataError,
    ValueError,
    RecursionError,
    OverflowError,
)


#: The shortest sleep for a rate limit's next token: a bucket never makes a worker spin.
MIN_RATE_WAIT = 0.005
# At most this many claim statements per round (WeightedShares.split's picks): with many
# busy queues, slots go in chunks to a few queues a round instead of one or two to each.
CLAIMS_PER_ROUND = 4
# ...and none for fewer jobs than this (or the batch size) while more slots are free: slots
# freed a few at a time went to four queues in claims of a few jobs (100 queues, 30,000
# jobs, 2 processes: 9.9 jobs per claim, ten times one queue's statements; 23 with this).
MIN_CLAIM_CHUNK = 50


class Fetcher:
    """Runs the claim loops; ``start(lease, deadline)`` hands each claimed lease on."""

    def __init__(
        self,
        config: WorkerConfig,
        client: AsyncClient,
        inflight: InFlight,
        events: WorkerEvents,
        outage: Outage,
        *,
        start: Callable[[Lease, float], None],
        stopping: asyncio.Event,
        wake: asyncio.Event,
    ) -> None:
        self.config = config
        self.client = client
        self.inflight = inflight
        self.events = events
        self.outage = outage
        self._start = start
        self._stopping = stopping
        self._wake = wake
        # Claims in flight: the slots they may fill, whether the queues look busy (the last
        # claim came back full), and whether the fetch loop has ended.
        self._reserved = 0
        self._busy = asyncio.Event()
        self._done = False
        # The claim size of queues without their own (adaptive_batch), and its cost fit.
        self._target = config.batch_size
        self._cost = ClaimCost()
        self._shares = WeightedShares([q.weight for q in config.queue_settings])
        # Queues whose last claim failed on bad data: consecutive failures, and when to try
        # that queue again.
        self._bad: dict[str, tuple[int, float]] = {}
        # Whether limits existed at the last look, and when to look again if not.
        self._limits_seen = True
        self._limits_check_at = 0.0

    async def run(self) -> None:
        """Claim until stopped (or, in burst/drain mode, until there is no more work)."""
        helpers = [
            asyncio.create_task(self._helper_claims(), name=f"leaseq-claims-{i + 1}")
            for i in range(self.config.claims_in_flight - 1)
        ]
        try:
            await self._primary_claims()
        finally:
            # Helpers never stop mid-claim (its jobs would be stranded until their leases
            # expire): they see the stop between claims.
            self._done = True
            self._busy.set()
            self.inflight.helper_slot_freed.set()
            # Not suppressing CancelledError here: a cancelled worker must stay cancelled.
            outcomes = await asyncio.gather(*helpers, return_exceptions=True)
        for outcome in outcomes:
            if isinstance(outcome, Exception):
                raise outcome  # as the primary's own error would

    async def _primary_claims(self) -> None:
        cfg = self.config
        slot_freed = self.inflight.slot_freed
        while not self._stopping.is_set():
            free = self._free_slots()
            if free <= 0:
                slot_freed.clear()
                await slot_freed.wait()
                continue
            # Both events are re-armed before the claim: a wake-up or a freed slot that
            # arrives while it runs ends the next sleep at once, and nothing older does (a
            # stale "slot freed" left set made an idle worker spin on claims).
            self._wake.clear()
            slot_freed.clear()
            # Only a claim that *started* with nothing in flight can prove the queues empty:
            # a job finishing during the claim may have made more work claimable (a retry,
            # the next job of its ordering key) after the claim's snapshot was taken, and a
            # helper's claim may be taking jobs right now.
            idle = not self.inflight and not self._reserved
            delay = self._poll_delay()
            try:
                async with asyncio.timeout(cfg.op_timeout):
                    claimed, exhausted = await self._reserved_round(free)
                    self.outage.ok()
                    if claimed and not exhausted:
                        continue  # more may be waiting: go again at once
                    if (
                        not claimed
                        and idle
                        and not self.inflight
                        and not self._reserved
                        and await self._finished()
                    ):
                        return
                    delay = await self._limit_delay(delay)
            except TRANSIENT as exc:
                await self.outage.failed("claim", exc)
                await self._sleep_or_wake(self.outage.backoff())
                continue
            await self._sleep_or_wake(delay)

    def _poll_delay(self) -> float:
        """The poll interval, or sooner when a backed-off queue may be tried again."""
        delay = self.config.poll_interval
        if self._bad:
            retry_at = min(at for _, at in self._bad.values())
            delay = min(delay, max(0.0, retry_at - time.monotonic()))
        return delay

    async def _limit_delay(self, delay: float) -> float:
        """After a short claim round: sleep no longer than until a rate limit holding these
        queues back admits again (nobody sends a wake-up for that), and no shorter. Asked
        while limits exist; with none, again only once a poll interval."""
        now = time.monotonic()
        if not self._limits_seen and now < self._limits_check_at:
            return delay
        exists, wait = await self.client.claim_wait(self.config.queue_names)
        self._limits_seen = exists
        self._limits_check_at = now + self.config.poll_interval
        if wait is None:
            return delay
        return min(delay, max(wait, MIN_RATE_WAIT))

    async def _helper_claims(self) -> None:
        """An extra claimer: idle unless the last claim came back full; never polls, and
        leaves outages to the primary loop (which backs off and reports them)."""
        try:
            await self._helper_loop()
        except Exception:
            self._stop()  # an error the primary would have died of stops the worker too
            raise

    def _stop(self) -> None:
        self._stopping.set()
        self._wake.set()
        self.inflight.slot_freed.set()

    async def _helper_loop(self) -> None:
        # The stop is checked after every wait: a claim that ends after the fetch loop's
        # final "wake up" may clear _busy again, and waiting for it then would hang the
        # shutdown (seen once when a busy worker got SIGTERM).
        freed = self.inflight.helper_slot_freed
        while not (self._done or self._stopping.is_set()):
            if not self._busy.is_set():
                await self._busy.wait()
                continue
            free = self._free_slots()
            if free <= 0:
                freed.clear()
                await freed.wait()
                continue
            try:
                async with asyncio.timeout(self.config.op_timeout):
                    claimed, exhausted = await self._reserved_round(free, helper=True)
            except TRANSIENT:
                claimed, exhausted = 0, True
            if not claimed or exhausted:
                self._busy.clear()

    def _batch(self, queue: QueueSettings) -> int:
        """Most jobs one claim from ``queue`` may take."""
        if queue.batch_size is not None or not self.config.adaptive_batch:
            return self.config.batch_for(queue)
        return self._target

    def _prefetch(self) -> int:
        """Leases held beyond the slots: the configured prefetch, or with adaptive_batch
        one claim of the current size (never more than the concurrency)."""
        cfg = self.config
        if not cfg.adaptive_batch:
            return cfg.prefetch
        return max(cfg.prefetch, min(cfg.concurrency, self._target))

    def _free_slots(self) -> int:
        """Slots neither running a job nor promised to a claim in flight; one claim round
        takes at most one batch per queue, so the other claimers get the rest. A lease whose
        outcome is being written holds no slot, up to ``concurrency`` of them: the next claim
        overlaps the completions' commit (a worker then holds at most twice its slots, plus
        prefetch), and a completer that falls behind holds the claims back."""
        cfg = self.config
        inflight = self.inflight
        held = len(inflight) - min(inflight.reporting, cfg.concurrency)
        free = cfg.concurrency + self._prefetch() - held - self._reserved
        return min(free, sum(self._batch(q) for q in cfg.queue_settings))

    async def _reserved_round(self, free: int, *, helper: bool = False) -> tuple[int, bool]:
        self._reserved += free
        try:
            claimed, exhausted = await self._claim_round(free)
        finally:
            self._reserved -= free
            if helper:
                # The primary may have found the queues empty while this claim was in
                # flight, which kept it from concluding "idle": let it look again.
                self.inflight.slot_freed.set()
        if claimed and not exhausted:
            self._busy.set()
        return claimed, exhausted

    async def _claim_round(self, free: int) -> tuple[int, bool]:
        """Split the free slots between the queues by weight and claim; slots a queue
        leaves unused (it ran dry) go to the others. Returns (claimed, all queues empty)."""
        queues = self.config.queue_settings
        claimed = 0
        # Still returning everything asked of it (a backed-off queue sits this round out).
        hungry = [not self._backed_off(q.name) for q in queues]
        # Ends: each pass either claims something (bounded by free) or finds every queue
        # it tried short, which leaves them out of the next pass. So "nothing claimed"
        # means every queue was asked this round, not just the few a chunked split picked.
        while free - claimed > 0 and any(hungry):
            shares = self._shares.split(
                free - claimed,
                hungry,
                picks=CLAIMS_PER_ROUND,
                min_chunk=min(MIN_CLAIM_CHUNK, self.config.batch_size),
            )
            for i, queue in enumerate(queues):
                want = min(shares[i], self._batch(queue))
                if want <= 0:
                    continue
                leases = await self._claim(queue, want)
                claimed += len(leases)
                if len(leases) < want:
                    hungry[i] = False
        return claimed, not any(hungry)

    def _backed_off(self, queue: str) -> bool:
        bad = self._bad.get(queue)
        return bad is not None and time.monotonic() < bad[1]

    async def _claim(self, queue: QueueSettings, limit: int) -> list[Lease]:
        lease_seconds = self.config.lease_for(queue)
        sent = time.monotonic()
        try:
            leases = await self.client.claim(
                queue.name, worker=self.config.worker_id, lease_seconds=lease_seconds, limit=limit
            )
        except CLAIM_DATA_ERRORS as exc:
            self._claim_failed(queue.name, exc)
            return []
        self._bad.pop(queue.name, None)
        took = time.monotonic() - sent
        if self.config.adaptive_batch and queue.batch_size is None:
            self._cost = self._cost.observe(len(leases), took)
            self._target = claim_size(
                self._cost,
                current=max(limit, self._target),
                floor=1,
                ceiling=validate.CLAIM_LIMIT_MAX,
            )
        self.events.claimed(queue.name, leases, took)
        for lease in leases:
            self._start(lease, sent + lease_seconds)
        return leases

    def _claim_failed(self, queue: str, exc: BaseException) -> None:
        failures = self._bad.get(queue, (0, 0.0))[0] + 1
        delay = self.outage.backoff_after(failures)
        self._bad[queue] = (failures, time.monotonic() + delay)
        self.events.claim_error(queue)
        log.error(
            "claim from queue %s failed on bad data (%s: %s); trying it again in %.1fs",
            queue,
            type(exc).__name__,
            first_line(exc),
            delay,
        )

    async def _finished(self) -> bool:
        """In burst mode: nothing claimable now. In drain mode: nothing left at all."""
        if self.config.drain:
            return not await self.client.queues_have_work(self.config.queue_names)
        if not self.config.burst:
            return False
        if self._bad:
            return True  # a queue whose claims fail on bad data is not waited for
        # Due jobs held back by a rate or concurrency limit are waited for: they are work
        # these queues have, only not admitted yet. Paused ones are not (a pause may last
        # for ever): the exit line reports them (Worker.run).
        _, held = await self.client.held_jobs(self.config.queue_names)
        return held == 0

    async def _sleep_or_wake(self, seconds: float) -> None:
        waiters = [
            asyncio.ensure_future(self._wake.wait()),
            asyncio.ensure_future(self.inflight.slot_freed.wait()),
        ]
        try:
            await asyncio.wait(waiters, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()
