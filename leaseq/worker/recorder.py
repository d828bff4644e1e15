"""Group commit of step records (docs/durable.md, "What it costs").

The record of a step that opened no ``ctx.transaction()`` is a fenced insert of its own.
On a worker running many jobs at once, the records that arrive while one write is in
flight are written together by the next: one statement (``step_records_batch``), each row
under its own lease's fence, and one commit. Every step still returns only after its own
record committed — the batching shares a round trip and a commit between jobs, it never
defers a record past its step — so what a step promises is unchanged: its record is
durable before the handler goes on, and a refused record (the lease ended) raises in that
step as before.

One write is in flight at a time; the drain task exists only while records wait. Sync
handlers hand their record to the worker's event loop and wait for the answer.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

import psycopg

from leaseq.models import Lease
from leaseq.worker.outage import TRANSIENT, first_line

if TYPE_CHECKING:
    from leaseq.client_async import AsyncClient

log = logging.getLogger("leaseq.worker")


@dataclass(slots=True)
class _Record:
    lease: Lease
    name: str
    seq: int
    text: str  # the result's JSON text
    done: asyncio.Future[bool]

    def row(self) -> tuple[Lease, str, int, str]:
        return self.lease, self.name, self.seq, self.text


class StepRecorder:
    """One per worker. :meth:`record` (async handlers) and :meth:`record_from_thread`
    (sync handlers) return True once the record committed, False when it was refused."""

    def __init__(self, client: AsyncClient, *, max_batch: int = 200, timeout: float = 30.0):
        self._client = client
        self._max_batch = max_batch
        self._timeout = timeout  # how long a handler thread waits for the loop's answer
        self._queue: list[_Record] = []
        self._drain_task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.batches = 0  # writes made (statements), for tests and benchmarks
        self.records = 0  # records written in them

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """The worker's event loop, where sync handlers' records are written."""
        self._loop = loop

    async def record(self, lease: Lease, name: str, seq: int, text: str) -> bool:
        loop = asyncio.get_running_loop()
        done: asyncio.Future[bool] = loop.create_future()
        self._queue.append(_Record(lease, name, seq, text, done))
        if self._drain_task is None:
            self._drain_task = loop.create_task(self._drain(), name="leaseq-step-recorder")
        return await done

    def record_from_thread(self, lease: Lease, name: str, seq: int, text: str) -> bool:
        assert self._loop is not None, "bind the worker's loop first"
        future = asyncio.run_coroutine_threadsafe(self.record(lease, name, seq, text), self._loop)
        return future.result(self._timeout)

    async def close(self) -> None:
        task = self._drain_task
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _drain(self) -> None:
        try:
            while self._queue:
                batch = self._queue[: self._max_batch]
                del self._queue[: self._max_batch]
                await self._write(batch)
        finally:
            self._drain_task = None
            for left in self._queue:  # only when cancelled (the worker is closing)
                left.done.cancel()
            self._queue.clear()

    async def _write(self, batch: list[_Record]) -> None:
        try:
            recorded = await self._client.step_records_batch([r.row() for r in batch])
        except asyncio.CancelledError:
            for r in batch:
                r.done.cancel()
            raise
        except TRANSIENT as exc:  # outcome unknown: each step raises, as its own write would
            _settle(batch, exc)
            return
        except psycopg.Error as exc:
            if len(batch) == 1:
                _settle(batch, exc)
                return
            # One row the server refused must not fail the others: each alone.
            log.warning("a batch of step records was refused (%s); one by one", first_line(exc))
            for one in batch:
                await self._write([one])
            return
        self.batches += 1
        self.records += len(batch)
        for r in batch:
            if not r.done.done():
                r.done.set_result((r.lease.job_id, r.lease.token, r.name) in recorded)


def _settle(batch: list[_Record], exc: BaseException) -> None:
    for r in batch:
        if not r.done.done():
            r.done.set_exception(exc)
