"""Found by the chaos run: when the fenced completion inside ``ctx.transaction()`` raised
while the connection stayed usable, the handler got psycopg's ``ProgrammingError: Explicit
commit() forbidden within a Transaction context`` instead of the real error.

``FencedTransaction.__exit__``/``__aexit__`` left the transaction block open when
``complete()`` raised, then exited the pooled connection's block as if nothing went wrong,
so psycopg tried ``commit()`` inside a transaction context. Nothing was committed, but the
original error was lost: a transient ``QueryCanceled`` became ``ProgrammingError`` (class
unknown, a budget of 3), and an async handler cancelled by its worker at the lease deadline
while awaiting the completion raised ``ProgrammingError`` instead of ``CancelledError``.
Seen in chaos runs as ``handler errors: ProgrammingError: Explicit commit() forbidden ...``
(seed 42 with ``--jobs 20000 --minutes 3 --workers 4``; seed 4 of the CI configuration).
Fixed in 0ba5484; these tests keep it fixed.
"""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest

import leaseq
from leaseq.worker.context import JobContext, JobServices


def _lease(client: leaseq.Client) -> leaseq.Lease:
    client.enqueue("t", {})
    (lease,) = client.claim(worker="w", lease_seconds=30)
    return lease


def _query_canceled(*args: Any, **kwargs: Any) -> bool:
    raise psycopg.errors.QueryCanceled("canceling statement due to statement timeout")


def test_sync_handler_sees_the_completions_own_error(client: leaseq.Client) -> None:
    lease = _lease(client)
    handler_client = leaseq.Client(client.dsn(), schema=client.schema)
    handler_client.complete = _query_canceled  # type: ignore[method-assign]
    ctx = JobContext(lease, "w", JobServices(sync_client=lambda: handler_client, async_client=None))
    try:
        with pytest.raises(psycopg.errors.QueryCanceled), ctx.transaction() as conn:
            conn.execute("SELECT 1")
    finally:
        handler_client.close()


async def test_async_handler_sees_the_completions_own_error(client: leaseq.Client) -> None:
    lease = _lease(client)
    handler_client = leaseq.AsyncClient(client.dsn(), schema=client.schema)

    async def canceled(*args: Any, **kwargs: Any) -> bool:
        return _query_canceled()

    handler_client.complete = canceled  # type: ignore[method-assign]
    ctx = JobContext(lease, "w", JobServices(sync_client=None, async_client=handler_client))
    try:
        with pytest.raises(psycopg.errors.QueryCanceled):
            async with ctx.transaction() as conn:
                await conn.execute("SELECT 1")
    finally:
        await handler_client.close()


async def test_cancelling_a_handler_inside_the_completion_cancels_it(
    client: leaseq.Client,
) -> None:
    """What the worker does at a lease's local deadline: cancel the handler's task."""
    lease = _lease(client)
    handler_client = leaseq.AsyncClient(client.dsn(), schema=client.schema)

    async def slow(lease: leaseq.Lease, *, connection: Any) -> bool:
        await connection.execute("SELECT pg_sleep(5)")
        return True

    handler_client.complete = slow  # type: ignore[method-assign]
    ctx = JobContext(lease, "w", JobServices(sync_client=None, async_client=handler_client))

    async def handler() -> None:
        async with ctx.transaction() as conn:
            await conn.execute("SELECT 1")

    task = asyncio.create_task(handler())
    await asyncio.sleep(0.5)
    task.cancel()
    try:
        with pytest.raises(asyncio.CancelledError):
            await task
    finally:
        await handler_client.close()
    job = client.get_job(lease.job_id)
    assert job is not None and job.status == leaseq.JobStatus.RUNNING, "nothing committed"
