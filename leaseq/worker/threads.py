"""Where sync handlers run: the handler slots, and a fixed pool of threads that run whole
attempts and hand their outcomes back to the event loop in batches.

``Slots`` bounds how many attempts hold a handler slot at once (``--concurrency``), async
and sync alike, first come first served; it lives on the loop.

``HandlerThreads`` is the sync side: the loop puts a ``SyncJob`` on a queue, a pool thread
takes it and runs the attempt (deadline check, payload check, handler, classification,
result), and puts the outcome on a list the loop empties. Only the first outcome of a batch
wakes the loop (``call_soon_threadsafe``); the others ride along, so a busy worker pays
one loop wake-up for many jobs instead of a future, a chained future and a wake-up each.

A job waiting for its thread can be *withdrawn* by the loop (shutdown of an unstarted job,
an abort): once withdrawn no thread runs it, and once a thread has taken it the loop can no
longer withdraw it. One lock makes that hand-over atomic, so a job is either run by a thread
or released by the loop, never both.
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import logging
import queue
import threading
from collections.abc import Callable

from leaseq.codes import ErrorCode
from leaseq.models import Failure, Lease
from leaseq.worker.inflight import Running

log = logging.getLogger("leaseq.worker")

Outcome = Lease | Failure  # a bare Lease means success (or: nothing to report, see executor)


class Slots:
    """The handler slots shared by async and sync attempts, granted in arrival order.

    Loop-only. An async attempt awaits :meth:`acquire`; a sync one is *granted* its slot by
    a callback (no task, no future): ``grant()`` runs at once when a slot is free, else when
    one is given back, and returns False when the job no longer wants it (it was withdrawn
    meanwhile), which passes the slot on.
    """

    def __init__(self, size: int) -> None:
        self._free = size
        self._waiting: collections.deque[Callable[[], bool]] = collections.deque()

    @property
    def free(self) -> int:
        return self._free

    def take(self, grant: Callable[[], bool]) -> None:
        if self._free > 0 and not self._waiting:
            self._free -= 1
            if not grant():
                self.give_back()
        else:
            self._waiting.append(grant)

    def give_back(self) -> None:
        while self._waiting:
            if self._waiting.popleft()():
                return  # the slot went straight to the next in line
        self._free += 1

    async def acquire(self) -> None:
        if self._free > 0 and not self._waiting:
            self._free -= 1
            return
        granted: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def grant() -> bool:
            if granted.done():  # its task was cancelled while it waited
                return False
            granted.set_result(None)
            return True

        self._waiting.append(grant)
        try:
            await granted
        except asyncio.CancelledError:
            if granted.done() and not granted.cancelled():
                self.give_back()  # granted, then cancelled before it could run
            raise


class SyncJob:
    """One sync attempt on its way through the threads. ``cancel()`` is what the worker calls
    on ``Running.task`` (an abort, or shutdown of an unstarted job): see Executor."""

    __slots__ = (
        "_cancel",
        "context",
        "finished",
        "has_slot",
        "running",
        "taken",
        "waiter",
    )

    def __init__(
        self,
        running: Running,
        cancel: Callable[[SyncJob], bool],
        waiter: asyncio.Future[Outcome] | None = None,
    ) -> None:
        self.running = running
        #: The handler runs in a copy of the loop's context at start: whatever a handler
        #: sets in a context variable stays with its own attempt.
        self.context = contextvars.copy_context()
        #: A task awaiting the outcome (tracing needs one); None on the plain path.
        self.waiter = waiter
        self._cancel = cancel
        #: Set under HandlerThreads' lock: a thread took the job (it can no longer be
        #: withdrawn); or the loop withdrew it (no thread will run it).
        self.taken = False
        #: Loop-only: the job holds a handler slot; its outcome was dealt with.
        self.has_slot = False
        self.finished = False

    def cancel(self) -> bool:
        return self._cancel(self)


class HandlerThreads:
    """A fixed pool of up to ``size`` threads (started as needed) running sync attempts.

    Waking a sleeping thread costs a context switch and a wait for the GIL, which the loop
    thread mostly holds: more than a no-op handler itself. So a job does not wake a thread
    of its own. At most one thread *searches* the queue at a time; one that takes a job
    while more wait wakes (or starts) the next searcher before it runs its own, so a batch
    of long jobs still fans out over the threads, while a batch of short ones is run by the
    few threads that are awake.
    """

    def __init__(
        self,
        size: int,
        attempt: Callable[[Running], Outcome],
        deliver: Callable[[SyncJob, Outcome], None],
        *,
        name_prefix: str = "leaseq-job",
    ) -> None:
        self._size = size
        self._attempt = attempt
        self._deliver = deliver
        self._name_prefix = name_prefix
        self._jobs: collections.deque[SyncJob] = collections.deque()
        #: One token wakes one sleeping thread; False tells it to end.
        self._tokens: queue.SimpleQueue[bool] = queue.SimpleQueue()
        self._lock = threading.Lock()
        # Under the lock: threads started, looking for a job, and asleep on a token.
        self._started = 0
        self._searching = 0
        self._sleeping = 0
        self._done: list[tuple[SyncJob, Outcome]] = []
        self._wake_scheduled = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False

    def submit(self, job: SyncJob) -> None:
        """Queue a job for the next free thread (loop thread only)."""
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        self._jobs.append(job)
        self._call_searcher()

    def withdraw(self, job: SyncJob) -> bool:
        """Keep a queued job from running (loop thread): False once a thread has taken it."""
        with self._lock:
            if job.taken:
                return False
            job.taken = True  # no thread will take it now
            return True

    def close(self) -> None:
        """Let idle threads end; busy ones end after their job (never waited for: a sync
        handler that was given up on may run on, and its outcome is dropped)."""
        self._closed = True
        with self._lock:
            started = self._started
        for _ in range(started):
            self._tokens.put(False)

    def _call_searcher(self) -> None:
        """Jobs wait: make sure a thread is looking for them (any thread)."""
        with self._lock:
            if self._searching:
                return  # it will find them
            if self._sleeping:
                self._sleeping -= 1
                self._searching += 1
                wake = True
            elif self._started < self._size:
                self._started += 1
                self._searching += 1
                wake = False
            else:
                return  # every thread is busy: the first one done takes the next job
            number = self._started
        if wake:
            self._tokens.put(True)
            return
        threading.Thread(
            target=self._serve,
            name=f"{self._name_prefix}_{number}",
            # Never joined at exit: an abandoned handler must not hold the process up.
            daemon=True,
        ).start()

    def _take(self) -> SyncJob | None:
        """Called searching; returns a job to run (no longer searching), None to end."""
        jobs, lock = self._jobs, self._lock
        while True:
            try:
                job = jobs.popleft()
            except IndexError:
                with lock:
                    if jobs:
                        continue  # one came in meanwhile
                    self._searching -= 1
                    self._sleeping += 1
                if not self._tokens.get():
                    return None  # (the waker counted this thread searching again)
                continue
            with lock:
                if job.taken:
                    continue  # withdrawn by the loop
                job.taken = True
                self._searching -= 1
            if jobs:
                self._call_searcher()  # the next one, while this thread runs its job
            return job

    def _serve(self) -> None:
        lock, attempt = self._lock, self._attempt
        while True:
            job = self._take()
            if job is None:
                return
            try:
                outcome = job.context.run(attempt, job.running)
            except BaseException:  # a bug (attempt() catches what handlers raise)
                log.exception("job %d: its attempt failed in leaseq", job.running.lease.job_id)
                # Reported as a lost lease (nothing written, not renewed: the sweeper
                # retries it once it expires), and still handed back: the loop must learn
                # that this thread is done with it.
                job.running.ctx.abort(ErrorCode.LEASE_LOST)
                outcome = job.running.lease
            with lock:
                self._searching += 1  # back to looking, after handing this one back
                self._done.append((job, outcome))
                if self._wake_scheduled:
                    continue  # the loop has not emptied the list yet: it will take this too
                self._wake_scheduled = True
            loop = self._loop
            if loop is not None and not self._closed:
                try:
                    loop.call_soon_threadsafe(self._deliver_done)
                except RuntimeError:  # the loop is closed: nobody is waiting any more
                    return

    def _deliver_done(self) -> None:
        """On the loop: every outcome handed back since the last wake-up."""
        with self._lock:
            done, self._done = self._done, []
            self._wake_scheduled = False
        deliver = self._deliver
        for job, outcome in done:
            try:
                deliver(job, outcome)
            except Exception:  # a bookkeeping bug must not strand the rest of the batch
                log.exception("handing back job %d's outcome failed", job.running.lease.job_id)
