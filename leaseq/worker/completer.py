"""Writes outcomes back: many finished jobs become one fenced statement.

A job counts as done only when the statement that records it has committed; then the
completer calls the job's ``on_done(status)``: the job's new status, or None when the lease
was lost and nothing was written. During an outage the write is retried with backoff, but only
while the lease can still be valid: once its local deadline has passed, the fence would
refuse it anyway.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import psycopg

from leaseq.client_async import AsyncClient
from leaseq.models import Failure, Lease
from leaseq.states import JobStatus
from leaseq.worker.outage import TRANSIENT, Outage, first_line

log = logging.getLogger("leaseq.worker")

Outcome = Lease | Failure  # a bare Lease means success


_Key = tuple[int, int]


@dataclass(slots=True)
class _Pending:
    outcome: Outcome
    lease: Lease
    #: The lease's identity in a batch: job id and token (made once, read several times).
    key: _Key
    deadline: float
    on_done: Callable[[JobStatus | None], None]
    #: A success's stored result: (JSON, seconds to keep), written with the completion.
    result: tuple[str, float] | None = None


class Completer:
    def __init__(
        self,
        client: AsyncClient,
        *,
        outage: Outage | None = None,
        max_batch: int = 500,
        op_timeout: float = 10.0,
    ) -> None:
        self._client = client
        self._outage = outage or Outage()
        self._max_batch = max_batch
        self._op_timeout = op_timeout
        self._queue: collections.deque[_Pending] = collections.deque()
        self._wake = asyncio.Event()

    def submit(
        self,
        outcome: Outcome,
        *,
        deadline: float,
        on_done: Callable[[JobStatus | None], None],
        result: tuple[str, float] | None = None,
    ) -> None:
        """Queue an outcome; ``on_done(status)`` runs once it is committed (or known lost).

        ``deadline`` is the monotonic time after which the lease has surely expired.
        """
        lease = outcome if isinstance(outcome, Lease) else outcome.lease
        key = (lease.job_id, lease.token)
        self._queue.append(_Pending(outcome, lease, key, deadline, on_done, result))
        self._wake.set()

    def idle(self) -> bool:
        return not self._queue

    async def run(self) -> None:
        """Flush loop: take everything waiting (up to max_batch) and write it in one go."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            queue = self._queue
            while queue:
                if len(queue) <= self._max_batch:
                    batch = list(queue)  # all of it, the usual case: no pop per job
                    queue.clear()
                else:
                    batch = [queue.popleft() for _ in range(self._max_batch)]
                await self._flush(batch)

    async def _flush(self, batch: list[_Pending]) -> None:
        successes = [p for p in batch if isinstance(p.outcome, Lease)]
        failures = [p for p in batch if isinstance(p.outcome, Failure)]
        done = await self._write(self._complete, successes, JobStatus.SUCCEEDED)
        done.update(await self._write(self._fail, failures))
        for pending in batch:
            try:
                pending.on_done(done.get(pending.key))
            except Exception:  # a bookkeeping bug must not stop every later completion
                log.exception("completion callback failed for job %d", pending.lease.job_id)

    async def _complete(self, pending: list[_Pending]) -> dict[_Key, JobStatus]:
        # By lease, not job id: a stale and a current lease of one job in one batch stay
        # apart (only the current one's completion and result count).
        results = {p.key: p.result for p in pending if p.result is not None}
        done = await self._client.complete_leases([p.lease for p in pending], results=results)
        return dict.fromkeys(done, JobStatus.SUCCEEDED)

    async def _fail(self, pending: list[_Pending]) -> dict[_Key, JobStatus]:
        failures = [p.outcome for p in pending if isinstance(p.outcome, Failure)]
        return await self._client.fail_leases(failures)

    async def _write(
        self,
        write: Callable[[list[_Pending]], Awaitable[dict[_Key, JobStatus]]],
        pending: list[_Pending],
        only: JobStatus | None = None,
    ) -> dict[_Key, JobStatus]:
        """One fenced batch write, retried through connection trouble; returns the new status
        of each lease the database accepted.

        Retrying is safe because the write is fenced. A try that failed (a timeout, a
        broken connection) has an unknown outcome: its commit may have happened (say, a
        synchronous commit done locally while waiting for a standby), and then the retry
        finds the lease gone. So after such a try, the jobs a retry misses are re-read
        (``attempts_ended``: ended by this lease's own write?): never assumed lost, never
        assumed done. ``only``: the one status that write sets (success).

        Any other database error (the server refused the statement: nothing was written)
        must not stop the completion task: the batch is written again one lease at a time,
        so the others are recorded, and a lease refused on its own is reported lost (its
        lease expires and the sweeper retries the job).
        """
        uncertain = False
        while pending:
            try:
                async with asyncio.timeout(self._op_timeout):
                    accepted = await write(pending)
                    missed = [p for p in pending if p.key not in accepted]
                    if uncertain and missed:
                        ended = await self._client.attempts_ended([p.lease for p in missed])
                        accepted.update(
                            (p.key, ended[p.lease.job_id])
                            for p in missed
                            if p.lease.job_id in ended
                            and (only is None or ended[p.lease.job_id] == only)
                        )
                self._outage.ok()
                return accepted
            except TRANSIENT as exc:
                uncertain = True
                await self._outage.failed("completion", exc)
                await asyncio.sleep(self._outage.backoff())
                now = time.monotonic()
                pending = [p for p in pending if p.deadline > now]
            except psycopg.Error as exc:
                if len(pending) == 1:
                    log.error(
                        "the outcome of job %d was refused by the database, its lease is "
                        "left to expire: %s",
                        pending[0].lease.job_id,
                        first_line(exc),
                        extra={"job_id": pending[0].lease.job_id},
                    )
                    return {}
                log.warning(
                    "a batch write was refused (%s); writing it lease by lease", first_line(exc)
                )
                accepted = {}
                for one in pending:
                    accepted.update(await self._write(write, [one], only))
                return accepted
        return {}
