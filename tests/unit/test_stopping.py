"""Stopping background tasks at a worker's exit: a cancel that was lost is repeated, and a
task that never ends is left behind instead of holding the process (leaseq/worker/stopping.py)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys

import pytest

from leaseq.worker.stopping import stop_tasks


async def _swallows_first_cancel(ticks: list[int]) -> None:
    """A periodic service whose cancel got lost once, as wait_for loses it on Python 3.11."""
    with contextlib.suppress(asyncio.CancelledError):  # lost: carries on as if nothing happened
        await asyncio.sleep(3600)
    while True:
        ticks.append(1)
        await asyncio.sleep(3600)


async def test_a_task_that_lost_its_cancel_is_cancelled_again() -> None:
    ticks: list[int] = []
    task = asyncio.create_task(_swallows_first_cancel(ticks))
    await asyncio.sleep(0)
    left = await asyncio.wait_for(stop_tasks([task], patience=10), 5)
    assert left == 0 and task.cancelled() and ticks == [1]


async def test_a_task_that_never_ends_is_left_behind_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    stop = asyncio.Event()

    async def stubborn() -> None:
        while not stop.is_set():
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                continue

    task = asyncio.create_task(stubborn(), name="stubborn")
    await asyncio.sleep(0)
    with caplog.at_level(logging.WARNING, logger="leaseq.worker"):
        left = await asyncio.wait_for(stop_tasks([task], patience=0.3), 5)
    assert left == 1 and not task.done()
    assert "did not stop within 0.3s" in caplog.text and "stubborn" in caplog.text
    stop.set()
    task.cancel()  # ends it: the loop in stubborn() sees stop after this cancel
    await asyncio.wait([task])


async def test_finished_and_failed_tasks_are_collected_quietly() -> None:
    async def fails() -> None:
        raise RuntimeError("boom")

    done = asyncio.create_task(asyncio.sleep(0))
    failed = asyncio.create_task(fails())
    sleeping = asyncio.create_task(asyncio.sleep(3600))
    await asyncio.sleep(0.01)
    assert await stop_tasks([done, failed, sleeping], patience=5) == 0
    assert sleeping.cancelled() and isinstance(failed.exception(), RuntimeError)


async def test_python_311_wait_for_loses_a_cancel_that_arrives_with_its_result() -> None:
    """The cause, shown: the inner wait completes and the task is cancelled in the same loop
    step; on 3.11 wait_for returns the result and the cancel is gone (CPython gh-86296)."""
    ready = asyncio.Event()
    outcome: list[str] = []

    async def waiter() -> None:
        await asyncio.wait_for(ready.wait(), 10)
        outcome.append("returned normally")

    task = asyncio.create_task(waiter())
    await asyncio.sleep(0)
    ready.set()
    task.cancel()
    await asyncio.sleep(0.01)
    if sys.version_info < (3, 12):
        assert outcome == ["returned normally"] and not task.cancelled()
    else:  # fixed there: the cancel is kept
        assert outcome == [] and task.cancelled()
