"""Writes outcomes back: many finished jobs become one fenced statement.

A job counts as done only when the statement that records it has committed; the caller
awaits its future and learns whether the lease still held (True) or was lost (False).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import psycopg

from leaseq.client_async import AsyncClient
from leaseq.models import Failure, Lease

log = logging.getLogger("leaseq.worker")

Outcome = Lease | Failure  # a bare Lease means success
T = TypeVar("T")
R = TypeVar("R")


@dataclass
class _Pending:
    outcome: Outcome
    done: asyncio.Future[bool]


class Completer:
    def __init__(self, client: AsyncClient, *, max_batch: int = 500) -> None:
        self._client = client
        self._max_batch = max_batch
        self._queue: asyncio.Queue[_Pending] = asyncio.Queue()

    async def report(self, outcome: Outcome) -> bool:
        """Queue an outcome and wait until it is committed; False means the lease was lost."""
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        await self._queue.put(_Pending(outcome, future))
        return await future

    def idle(self) -> bool:
        return self._queue.empty()

    async def run(self) -> None:
        """Flush loop: take everything waiting (up to max_batch) and write it in one go."""
        while True:
            batch = [await self._queue.get()]
            while len(batch) < self._max_batch and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            await self._flush(batch)

    async def _flush(self, batch: list[_Pending]) -> None:
        successes = [p.outcome for p in batch if isinstance(p.outcome, Lease)]
        failures = [p.outcome for p in batch if isinstance(p.outcome, Failure)]
        completed = await self._retrying(self._client.complete_many, successes)
        failed = set(await self._retrying(self._client.fail_many, failures))
        for pending in batch:
            outcome = pending.outcome
            if isinstance(outcome, Lease):
                ok = outcome.job_id in completed
            else:
                ok = outcome.lease.job_id in failed
            if not pending.done.done():
                pending.done.set_result(ok)

    async def _retrying(self, write: Callable[[list[T]], Awaitable[R]], items: list[T]) -> R:
        """Run one fenced write, retrying through connection trouble.

        Retrying is safe because the write is fenced: if the first try did commit before
        the connection broke, the retry finds the lease gone and reports it as not ours,
        which errs on the side of never claiming a success we cannot see.
        """
        delay = 0.05
        while True:
            try:
                return await write(items)
            except psycopg.OperationalError as exc:
                log.warning("completion write failed (%s); retrying", str(exc).strip()[:200])
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)
