"""Stopping the worker's background tasks (completer, lease keeper, maintenance services,
listener) at the end of a run.

One ``cancel()`` is not always enough on Python 3.11: ``asyncio.wait_for`` returns the inner
result and drops the cancel when both arrive in the same loop step (CPython gh-86296,
fixed in 3.12 only), and psycopg_pool waits for a free connection through ``wait_for``. A
sweeper whose first tick got its connection just as the worker stopped then ran the tick,
went back to sleep, and the worker never exited (a ``--burst`` worker with nothing to do,
seen in CI under load). So a task that is still running after a cancel is cancelled again,
and one that outlasts the patience is left behind with a warning instead of holding the
process for ever.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Any

log = logging.getLogger("leaseq.worker")

#: How long one cancel is given before the task is cancelled again: long enough for a
#: task's own cleanup (closing its connection), short enough that a lost cancel costs little.
RECANCEL_AFTER = 0.5


async def stop_tasks(tasks: Iterable[asyncio.Task[Any]], *, patience: float) -> int:
    """Cancel ``tasks`` and wait until each has ended, cancelling again any that carries on.

    Returns how many were still running after ``patience`` seconds (left behind). Their
    errors are consumed: a background task failing while it is being stopped is not news.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + patience
    everything = list(tasks)
    pending = {task for task in everything if not task.done()}
    while pending:
        for task in pending:
            task.cancel()
        left = deadline - loop.time()
        if left <= 0:
            break
        _, pending = await asyncio.wait(pending, timeout=min(RECANCEL_AFTER, left))
    for task in everything:
        if task.done() and not task.cancelled():
            task.exception()  # retrieved, so asyncio does not log it at exit
    if pending:
        log.warning(
            "%d background task(s) did not stop within %gs: left behind (%s)",
            len(pending),
            patience,
            ", ".join(sorted(task.get_name() for task in pending)),
        )
    return len(pending)
