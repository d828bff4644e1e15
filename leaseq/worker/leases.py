"""The lease keeper: fenced renewal, local deadlines, ``max_runtime`` and ``NO_PROGRESS``.

Every tick (``renew_every``) one fenced statement per lease length renews the leases that
deserve it (the progress policy); a lease the database refuses is lost, and a cancel
request found on renewal stops its handler. Between ticks the keeper wakes for the earliest
*local deadline* (a lease that joins with an earlier deadline wakes it at once): if no
renewal was confirmed before it, the worker assumes the lease is gone and stops the handler,
even when the database cannot be reached to say so. It also enforces ``max_runtime``, keeps
renewing a stopped sync handler's lease until its thread has ended, and carries out the
hard stop of one that outlives ``stop_grace`` (leaseq.worker.stops).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from leaseq.client_async import AsyncClient
from leaseq.codes import ErrorCode
from leaseq.worker.config import WorkerConfig
from leaseq.worker.inflight import InFlight, Running
from leaseq.worker.outage import TRANSIENT, Outage
from leaseq.worker.stops import EXIT_HARD_STOP, exit_now, postponed_hard_stop

log = logging.getLogger("leaseq.worker")


def _wake_for(running: Running) -> float:
    """When the keeper must look at this lease next: its local deadline (or the end of its
    ``max_runtime``, if sooner) while it is policed, its hard stop while its thread is
    being stopped."""
    if running.watched:
        task, started_at = running.task_def, running.started_at
        if started_at is not None and task is not None and task.max_runtime is not None:
            # Just past the end: the check below stops what ran *longer* than max_runtime.
            return min(running.deadline, started_at + task.max_runtime + 0.001)
        return running.deadline
    return running.hard_stop_at or running.deadline


class LeaseKeeper:
    def __init__(
        self,
        config: WorkerConfig,
        client: AsyncClient,
        inflight: InFlight,
        outage: Outage,
        *,
        exit_process: Callable[[], None] = exit_now,
    ) -> None:
        self._exit_process = exit_process
        self.config = config
        self.client = client
        self.inflight = inflight
        self.events = inflight.events
        self.outage = outage
        self._renewal: asyncio.Task[None] | None = None

    async def run(self) -> None:
        """Renew on a fixed tick; between ticks, wake for the earliest local deadline."""
        inflight = self.inflight
        tick = self.config.renew_every
        next_renewal = time.monotonic() + tick
        while True:
            now = time.monotonic()
            earliest = min(
                (_wake_for(r) for r in inflight.all() if r.watched or r.hard_stop_at),
                default=now + tick,
            )
            wake_at = min(next_renewal, earliest)
            inflight.keeper_wakes_at = wake_at
            inflight.sooner.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(inflight.sooner.wait(), max(0.0, wake_at - now) + 0.001)
            now = time.monotonic()
            self._check_deadlines(now)
            if now >= next_renewal:
                next_renewal = now + tick
                if self._renewal is None or self._renewal.done():
                    # Its own task: a renewal stuck on a dead connection must not stop the
                    # deadline checks above from firing.
                    self._renewal = asyncio.create_task(self._renew(tick))

    def _check_deadlines(self, now: float) -> None:
        for running in self.inflight.all():
            if running.hard_stop_at is not None and running.hard_stop_at <= now:
                self._hard_stop_due(running, now)
            if not running.watched:
                continue
            if running.deadline <= now:
                self.inflight.abort(running, ErrorCode.LEASE_LOST)
                continue
            task = running.task_def
            if running.started_at is None or task is None:
                continue
            if task.max_runtime is not None and now - running.started_at > task.max_runtime:
                self.inflight.abort(running, ErrorCode.MAX_RUNTIME_EXCEEDED)

    def _hard_stop_due(self, running: Running, now: float) -> None:
        """The grace is over, unless the database is out: a handler blocked in a database
        call (its pool waiting for a connection) waits out the same outage as the worker,
        and a new process could not connect either. Then the grace counts again from the
        end of the outage."""
        later = postponed_hard_stop(
            now,
            grace=self.config.stop_grace or 0.0,
            database_down=self.outage.down,
            outage_ended_at=self.outage.ended_at,
            recheck=self.config.renew_every,
        )
        if later is None:
            self._hard_stop(running)
        else:
            running.hard_stop_at = later

    def _hard_stop(self, running: Running) -> None:
        """A stopped sync handler outlived ``stop_grace``: end the process (see stops.py)."""
        self.events.handler_stopped("hard")
        lease = running.lease
        log.critical(
            "job %d (token %d, task %s): its sync handler is still running %gs after the "
            "soft stop (%s); hard stop: the worker process exits with code %d for its "
            "supervisor to replace it; its %d lease(s) expire and are retried",
            lease.job_id,
            lease.token,
            lease.task,
            self.config.stop_grace or 0.0,
            running.ctx.aborted,
            EXIT_HARD_STOP,
            len(self.inflight),
        )
        running.hard_stop_at = None  # once (the exit does not return in production)
        self._exit_process()

    @staticmethod
    def _deserves_renewal(running: Running, now: float) -> bool:
        if running.stop_sent_at is not None:
            # Its thread still runs after the soft stop: keep the lease so that the job is
            # not offered to anyone else (unless the lease was lost already).
            return running.ctx.aborted != ErrorCode.LEASE_LOST
        if running.ctx.aborted is not None:
            return False
        if running.started_at is None or running.task_def is None or running.reporting:
            return True  # waiting for a slot, or its outcome is being written: keep it
        if running.task_def.renew == "alive":
            return True
        return now - running.ctx.last_progress <= running.lease.lease_seconds

    async def _renew(self, tick: float) -> None:
        now = time.monotonic()
        current = self.inflight.all()
        keep = [r for r in current if self._deserves_renewal(r, now)]
        for running in current:
            # No progress within a lease length: stop before the lease runs out, and report
            # it (fenced, while the lease still holds) so the retry policy applies at once.
            if running not in keep and running.watched:
                self.inflight.abort(running, ErrorCode.NO_PROGRESS)
        by_length: dict[float, list[Running]] = {}
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
                self.events.heartbeat_failed()
                await self.outage.failed("lease renewal", exc)
                continue
            if result.lost:
                self.events.lost_fence("heartbeat", len(result.lost))
            for running in group:
                # Only what is still the keeper's to police: a handler may have finished
                # while the renewal was in flight, and then its outcome is on its way and
                # the fence decides (a lost lease counted there, not twice).
                if running.key in result.lost:
                    if running in self.inflight and running.watched:
                        self.inflight.abort(running, ErrorCode.LEASE_LOST)
                else:
                    running.deadline = sent + seconds
                    if running.lease.job_id in result.cancel_requested and running.watched:
                        self.inflight.abort(running, ErrorCode.CANCELLED)
