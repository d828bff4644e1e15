"""What runs after jobs ended, in the transaction of the transition that ended them: the
dependents they held back are decided (promoted, or cancelled for a failed dependency, down
the graph) and the batches they belonged to fire their callbacks. Every mixin whose
statements end jobs (lease, failure, admin, deps) inherits this one.

The rules it applies are the database's: each step locks the rows whose decision may change
(lock_dependents, lock_batches_of) and then decides with a new statement, whose snapshot is
taken after those locks. That holds at READ COMMITTED, which every leaseq transaction runs
at (see ``AsyncClientBase._transaction``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from psycopg import AsyncConnection

from leaseq.ops.base_async import AsyncClientBase

__all__ = ["AsyncEndingOps"]


class AsyncEndingOps(AsyncClientBase):
    async def _promote_dependents(self, conn: AsyncConnection[Any], ended: Iterable[int]) -> None:
        """After jobs ended (succeeded, dead, cancelled) in ``conn``'s transaction: lock
        their waiting dependents, then decide them with a new snapshot (promote_dependents).
        A dependent cancelled for a failed dependency has ended too: its own dependents are
        decided next, down the graph."""
        ids = sorted(set(ended))
        while ids:
            await self._fire_batches_of(conn, ids)
            locked = await self._rows("lock_dependents", {"ids": ids}, conn)
            if not locked:
                return
            ids = await self._decide_waiting(conn, [int(row[0]) for row in locked], ids)

    async def _fire_batches_of(self, conn: AsyncConnection[Any], ended: list[int]) -> None:
        """The unfinished batches of jobs that ended: locked, then fired if they are sealed
        and all their jobs ended (fire_batches, with a new snapshot)."""
        locked = await self._rows("lock_batches_of", {"ids": ended}, conn)
        if locked:
            await self._fire_batches(conn, [int(row[0]) for row in locked])

    async def _fire_batches(self, conn: AsyncConnection[Any], ids: list[int]) -> None:
        await self._rows("fire_batches", {"ids": ids, "channel": self.channel}, conn)

    async def _wait_again(self, conn: AsyncConnection[Any], ids: list[int]) -> None:
        """Jobs this transaction made wait again (replays): lock their dependencies, so a
        dependency ending meanwhile has committed (or waits for us and then promotes them),
        then decide them with a new snapshot, as at enqueue."""
        if not ids:
            return
        parents = [int(r[0]) for r in await self._rows("dependency_ids", {"ids": ids}, conn)]
        if not parents:
            return
        await self._rows("lock_dependency_parents", {"ids": sorted(parents)}, conn)
        await self._promote_dependents(conn, await self._decide_waiting(conn, ids))

    async def _decide_waiting(
        self, conn: AsyncConnection[Any], ids: list[int], ended: list[int] | None = None
    ) -> list[int]:
        """promote_dependents over waiting jobs this transaction locked or inserted; returns
        those that ended cancelled (their dependents are to be decided in turn). ``ended``:
        the jobs whose ending runs this (None: check every dependency for a failure)."""
        params = {"ids": ids, "ended": ended, "channel": self.channel}
        rows = await self._rows("promote_dependents", params, conn)
        return sorted(int(row[0]) for row in rows if row[1] == "cancelled")
