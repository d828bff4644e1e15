"""Stored results: reading a job's outcome, waiting for it (``result()``: LISTEN for the
notification the fenced completion sends, plus a safety poll that also covers a dropped
listener), and the outcomes of a job's dependencies. Results are WRITTEN by the completion
(``lease_async.complete_many``), never here.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

import psycopg
from psycopg import AsyncConnection, sql

from leaseq import validate
from leaseq.errors import JobCancelled, JobDead, JobNotFound, ResultTimeout
from leaseq.models import JobResult
from leaseq.ops.payloads_async import AsyncPayloadOps
from leaseq.params import results_channel


def _result(job_id: int, row: Sequence[Any], open_value: Callable[[Any, str], Any]) -> JobResult:
    """A JobResult from a row; a sealed value is opened (an EncryptionError without its
    key: a result is never handed over as its envelope)."""
    found = JobResult(job_id, *row)
    if found.stored and found.value is not None:
        opened = open_value(found.value, "result")
        if opened is not found.value:
            found = dataclasses.replace(found, value=opened)
    return found


class AsyncResultOps(AsyncPayloadOps):
    async def job_result(self, job_id: int) -> JobResult | None:
        """The job's outcome now (no waiting); None when neither the job nor a stored
        result exists."""
        rows = await self._rows("job_result", {"id": job_id})
        return _result(job_id, rows[0], self._open) if rows else None

    async def dependency_results(self, job_id: int) -> dict[int, JobResult]:
        """The outcome of each dependency of ``job_id`` (failed ones under on_dead
        ``ignore`` left out), by dependency id."""
        rows = await self._rows("dependency_results", {"id": job_id})
        return {int(r[0]): _result(int(r[0]), r[1:], self._open) for r in rows}

    async def result(
        self, job_id: int, *, timeout: float | None = None, poll_interval: float = 1.0
    ) -> Any:
        """Wait until the job ends; return its stored value (None for a task without
        store_result). Raises :class:`JobDead` or :class:`JobCancelled` (with the last
        failure), :class:`ResultTimeout` after ``timeout`` seconds, :class:`JobNotFound`.

        Woken by the notification the completion sends with a stored result (a few ms);
        every ``poll_interval`` seconds it also reads the job, so an outcome without a
        notification (dead, cancelled, no stored result) or a dropped listener only
        delays the answer."""
        poll = validate.check_positive_seconds("poll_interval", poll_interval, 3600.0)
        deadline = None if timeout is None else time.monotonic() + max(0.0, float(timeout))
        listener = await self._listen()
        try:
            while True:
                found = await self.job_result(job_id)
                if found is None:
                    raise JobNotFound(f"no job with id {job_id}")
                if found.status == "succeeded":
                    return found.value
                if found.status in ("dead", "cancelled"):
                    error = JobDead if found.status == "dead" else JobCancelled
                    raise error(job_id, found.status, found.error_code, found.error_detail)
                wait = poll if deadline is None else min(poll, deadline - time.monotonic())
                if wait <= 0:
                    raise ResultTimeout(f"job {job_id} had not ended after {timeout:g}s")
                listener = await self._wait_for(listener, job_id, wait)
        finally:
            if listener is not None:
                await listener.close()

    async def _listen(self) -> AsyncConnection[Any] | None:
        """A connection of our own listening on the results channel (None: poll only)."""
        try:
            conn = await self.connect(autocommit=True)
            channel = sql.Identifier(results_channel(self.schema))
            await conn.execute(sql.SQL("LISTEN {}").format(channel))
        except (psycopg.Error, OSError):
            return None
        return conn

    @staticmethod
    async def _wait_for(
        listener: AsyncConnection[Any] | None, job_id: int, wait: float
    ) -> AsyncConnection[Any] | None:
        """Until this job's notification or ``wait`` seconds; a listener that broke is
        dropped (polling goes on)."""
        if listener is None:
            await asyncio.sleep(wait)
            return None
        wanted = str(job_id)
        try:
            async for note in listener.notifies(timeout=wait):
                if note.payload == wanted:
                    break
        except (psycopg.Error, OSError):
            await listener.close()
            return None
        return listener
