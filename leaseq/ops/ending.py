# Generated from leaseq/ops/ending_async.py by tools/gen_sync.py. Do not edit by hand:
# change the async source and run `python tools/gen_sync.py`.
"""What runs after jobs ended, in the transaction of the transition that ended them: the
dependents they held back are decided (promoted, or cancelled for a failed dependency, down
the graph) and the batches they belonged to fire their callbacks. Every mixin whose
statements end jobs (lease, failure, admin, deps) inherits this one.

The synchronous twin of ``leaseq/ops/ending_async.py``; see that file for the logic.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from psycopg import Connection

from leaseq.ops.base import ClientBase

__all__ = ["EndingOps"]


class EndingOps(ClientBase):
    def _promote_dependents(self, conn: Connection[Any], ended: Iterable[int]) -> None:
        """After jobs ended (succeeded, dead, cancelled) in ``conn``'s transaction: lock
        their waiting dependents, then decide them with a new snapshot (promote_dependents).
        A dependent cancelled for a failed dependency has ended too: its own dependents are
        decided next, down the graph."""
        ids = sorted(set(ended))
        while ids:
            self._fire_batches_of(conn, ids)
            locked = self._rows("lock_dependents", {"ids": ids}, conn)
            if not locked:
                return
            ids = self._decide_waiting(conn, [int(row[0]) for row in locked], ids)

    def _fire_batches_of(self, conn: Connection[Any], ended: list[int]) -> None:
        """The unfinished batches of jobs that ended: locked, then fired if they are sealed
        and all their jobs ended (fire_batches, with a new snapshot)."""
        locked = self._rows("lock_batches_of", {"ids": ended}, conn)
        if locked:
            self._fire_batches(conn, [int(row[0]) for row in locked])

    def _fire_batches(self, conn: Connection[Any], ids: list[int]) -> None:
        self._rows("fire_batches", {"ids": ids, "channel": self.channel}, conn)

    def _wait_again(self, conn: Connection[Any], ids: list[int]) -> None:
        """Jobs this transaction made wait again (replays): lock their dependencies, so a
        dependency ending meanwhile has committed (or waits for us and then promotes them),
        then decide them with a new snapshot, as at enqueue."""
        if not ids:
            return
        parents = [int(r[0]) for r in self._rows("dependency_ids", {"ids": ids}, conn)]
        if not parents:
            return
        self._rows("lock_dependency_parents", {"ids": sorted(parents)}, conn)
        self._promote_dependents(conn, self._decide_waiting(conn, ids))

    def _decide_waiting(
        self, conn: Connection[Any], ids: list[int], ended: list[int] | None = None
    ) -> list[int]:
        """promote_dependents over waiting jobs this transaction locked or inserted; returns
        those that ended cancelled (their dependents are to be decided in turn). ``ended``:
        the jobs whose ending runs this (None: check every dependency for a failure)."""
        params = {"ids": ids, "ended": ended, "channel": self.channel}
        rows = self._rows("promote_dependents", params, conn)
        return sorted(int(row[0]) for row in rows if row[1] == "cancelled")
