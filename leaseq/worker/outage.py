"""One clear log line per database outage instead of a traceback per failed statement."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

from leaseq.retry import backoff

log = logging.getLogger("leaseq.worker")

#: Errors that mean "the database is not reachable right now", not "the query is wrong".
#: A read-only server (SQLSTATE 25006) is one: after a managed failover the old primary
#: takes no writes, and the client has already dropped that connection (see
#: ``leaseq.ops.base_async.FAILOVER_SQLSTATES``), so a retry reaches the new primary. The
#: shutdown states (57P01-57P03) are OperationalErrors anyway.
try:
    import psycopg
    import psycopg_pool

    TRANSIENT: tuple[type[BaseException], ...] = (
        psycopg.OperationalError,
        psycopg.errors.ReadOnlySqlTransaction,
        psycopg.InterfaceError,
        psycopg_pool.PoolTimeout,
        TimeoutError,
        OSError,
    )
except ImportError:  # pragma: no cover - psycopg is a hard dependency
    TRANSIENT = (TimeoutError, OSError)


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:200] if text else type(exc).__name__


class Outage:
    """Tracks whether the database is reachable, as seen by one worker.

    The first failure logs a warning; further failures during the same outage log at debug
    level only; the first success afterwards logs how long it lasted. ``backoff()`` gives
    the next retry delay: exponential with full jitter, capped.
    """

    def __init__(
        self,
        *,
        heal: Callable[[], Awaitable[None]] | None = None,
        base: float = 0.1,
        cap: float = 10.0,
    ) -> None:
        self._heal = heal
        self._base = base
        self._cap = cap
        self._since: float | None = None
        self._failures = 0
        self.outages = 0
        #: Monotonic time the last outage ended (None: none yet).
        self.ended_at: float | None = None

    @property
    def down(self) -> bool:
        return self._since is not None

    async def failed(self, what: str, exc: BaseException) -> None:
        """Record a failed statement, and let ``heal`` drop broken pooled connections so
        the retry gets a fresh one instead of the next corpse."""
        self._failures += 1
        if self._since is None:
            self._since = time.monotonic()
            self.outages += 1
            log.warning(
                "database unavailable (%s: %s); retrying with backoff", what, first_line(exc)
            )
        else:
            log.debug("still unavailable (%s: %s)", what, first_line(exc))
        if self._heal is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(5.0):
                    await self._heal()

    def ok(self) -> None:
        if self._since is not None:
            log.warning(
                "database reachable again after %.1fs (%d failed attempts)",
                time.monotonic() - self._since,
                self._failures,
            )
            self._since = None
            self._failures = 0
            self.ended_at = time.monotonic()

    def backoff(self) -> float:
        return self.backoff_after(self._failures)

    def backoff_after(self, failures: int) -> float:
        """The delay after ``failures`` consecutive failures of anything (same curve)."""
        return backoff(failures + 1, base=self._base, cap=self._cap, jitter=0.5)
