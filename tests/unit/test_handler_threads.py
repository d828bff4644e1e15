"""The sync handlers' thread pool and the handler slots, without a database.

Boundaries: a job the loop withdrew is never run by a thread, and a job a thread took can
no longer be withdrawn (so shutdown never releases a lease under a running handler);
outcomes finished together come back to the loop in one wake-up, not one each; slots are
granted in arrival order and a withdrawn waiter passes its slot on.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import threading
import time
from typing import Any

from leaseq.models import Lease
from leaseq.worker.context import JobContext
from leaseq.worker.inflight import Running
from leaseq.worker.threads import HandlerThreads, Outcome, Slots, SyncJob


def _running(job_id: int) -> Running:
    now = dt.datetime.now(dt.UTC)
    lease = Lease(
        job_id=job_id,
        token=1,
        owner="w",
        task="t",
        queue="default",
        payload=None,
        attempt=1,
        max_attempts=3,
        expires_at=now + dt.timedelta(seconds=30),
    )
    return Running(lease, JobContext(lease, "w"), None, time.monotonic() + 30)


class _Recorder:
    """Runs attempts (blocking the first one until released) and records deliveries."""

    def __init__(self) -> None:
        self.ran: list[int] = []
        self.delivered: list[int] = []
        self.first_started = threading.Event()
        self.release_first = threading.Event()

    def attempt(self, running: Running) -> Outcome:
        if not self.ran:
            self.ran.append(running.lease.job_id)
            self.first_started.set()
            self.release_first.wait(10)
        else:
            self.ran.append(running.lease.job_id)
        return running.lease

    def deliver(self, job: SyncJob, outcome: Outcome) -> None:
        self.delivered.append(job.running.lease.job_id)


def _job(job_id: int) -> SyncJob:
    return SyncJob(_running(job_id), lambda job: False)


async def _until(condition: Any, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.005)


async def test_a_withdrawn_job_never_runs_and_a_taken_one_cannot_be_withdrawn() -> None:
    rec = _Recorder()
    threads = HandlerThreads(1, rec.attempt, rec.deliver)
    busy, queued = _job(1), _job(2)
    threads.submit(busy)
    await asyncio.to_thread(rec.first_started.wait, 10)
    threads.submit(queued)  # behind the only thread, which is busy
    assert threads.withdraw(busy) is False, "a thread has it: the loop must not release it"
    assert threads.withdraw(queued) is True
    rec.release_first.set()
    await _until(lambda: rec.delivered == [1])
    late = _job(3)
    threads.submit(late)  # the thread moves on past the withdrawn job to this one
    await _until(lambda: rec.delivered == [1, 3])
    assert rec.ran == [1, 3], "the withdrawn job must never run"
    threads.close()


async def test_outcomes_finished_together_come_back_in_one_loop_wake_up() -> None:
    rec = _Recorder()
    wake_ups = 0

    class Counting(HandlerThreads):
        def _deliver_done(self) -> None:
            nonlocal wake_ups
            wake_ups += 1
            super()._deliver_done()

    threads = Counting(1, rec.attempt, rec.deliver)
    jobs = [_job(i) for i in range(1, 51)]
    for job in jobs:
        threads.submit(job)
    await asyncio.to_thread(rec.first_started.wait, 10)
    rec.release_first.set()
    # Hold the loop (as a busy worker's loop is held by claims and completions) while the
    # thread finishes the other 49: they must wait for one wake-up, not schedule one each.
    time.sleep(0.3)
    await _until(lambda: len(rec.delivered) == 50)
    assert sorted(rec.delivered) == list(range(1, 51))
    assert wake_ups <= 3, f"{wake_ups} loop wake-ups for 50 outcomes"
    threads.close()


async def test_threads_start_as_needed_up_to_the_pool_size() -> None:
    release = threading.Event()
    names: set[str] = set()

    def attempt(running: Running) -> Outcome:
        names.add(threading.current_thread().name)
        release.wait(10)
        return running.lease

    delivered: list[int] = []
    threads = HandlerThreads(3, attempt, lambda job, _: delivered.append(job.running.lease.job_id))
    for i in range(1, 7):
        threads.submit(_job(i))
    await _until(lambda: len(names) == 3)
    release.set()
    await _until(lambda: len(delivered) == 6)
    assert len(names) == 3 and all(n.startswith("leaseq-job") for n in names)
    threads.close()


async def test_slots_are_granted_in_arrival_order_and_a_withdrawn_waiter_passes_its_slot() -> None:
    slots = Slots(1)
    order: list[str] = []
    slots.take(lambda: order.append("a") is None)  # takes the only slot
    slots.take(lambda: False)  # a sync job withdrawn while it waited
    waiter = asyncio.ensure_future(slots.acquire())
    await asyncio.sleep(0)  # the waiter queues behind the withdrawn job
    slots.take(lambda: order.append("c") is None)
    assert order == ["a"] and not waiter.done()
    slots.give_back()  # a's slot: the withdrawn job declines it, the async waiter gets it
    await asyncio.wait_for(waiter, 5)
    assert order == ["a"]
    slots.give_back()
    assert order == ["a", "c"]
    slots.give_back()
    assert slots.free == 1


async def test_a_slot_granted_to_a_task_cancelled_before_it_ran_is_given_back() -> None:
    slots = Slots(1)
    await slots.acquire()
    waiter = asyncio.ensure_future(slots.acquire())
    await asyncio.sleep(0)
    slots.give_back()  # granted to the waiter ...
    waiter.cancel()  # ... which is cancelled before it could run
    await asyncio.gather(waiter, return_exceptions=True)
    assert slots.free == 1


async def test_a_batch_of_long_jobs_fans_out_over_every_thread() -> None:
    """A job does not wake a thread of its own (the searcher relays): yet a batch of jobs
    that all block must still run all at once, each on its own thread."""
    size = 20
    barrier = threading.Barrier(size, timeout=10)
    delivered: list[int] = []

    def attempt(running: Running) -> Outcome:
        barrier.wait()  # breaks (and raises) unless all 20 run at the same time
        return running.lease

    threads = HandlerThreads(
        size, attempt, lambda job, _: delivered.append(job.running.lease.job_id)
    )
    for i in range(size):
        threads.submit(_job(i))
    await _until(lambda: len(delivered) == size)
    assert not barrier.broken
    threads.close()
