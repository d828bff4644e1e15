# Generated from leaseq/ops/pauses_async.py by tools/gen_sync.py. Do not edit by hand:
# change the async source and run `python tools/gen_sync.py`.
"""Durable pauses: pause and resume a queue, a task or an ordering key, list the pauses in
force and the operator audit trail (``admin_events``).

The synchronous twin of ``leaseq/ops/pauses_async.py``; see that file for the logic.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from psycopg import Connection

from leaseq import validate
from leaseq.ops.base import ClientBase
from leaseq.rules.pauses import (
    AdminEvent,
    Pause,
    admin_events_from_rows,
    check_actor,
    check_reason,
    pauses_from_rows,
    scope_of,
)


class PauseOps(ClientBase):
    def pause(
        self,
        queue: str | None = None,
        *,
        task: str | None = None,
        ordering_key: str | None = None,
        reason: str,
        actor: str | None = None,
        cancel_running: bool = False,
        connection: Connection[Any] | None = None,
    ) -> bool:
        """Stop claims of one queue, task or ordering key until :meth:`resume`; audited.

        The pause holds from its commit: no claim of the scope commits after it, and none
        is made while it stands, whatever workers restart. A queue with no jobs yet can be
        paused. Running jobs keep their leases and finish; ``cancel_running=True`` also asks
        them to stop (their workers see it at the next heartbeat, as with :meth:`cancel`).
        Returns False when the scope was already paused (that pause is kept as it was).

        With ``connection=``, the pause joins the caller's transaction: it is in force only
        once that transaction commits (never, if it rolls back), and until it ends every
        claim waits (the barrier is a table lock held to commit), so keep it short.
        """
        self._refuse_isolation(connection)
        scope, value = scope_of(queue, task, ordering_key)
        params = {
            "scope": scope,
            "value": value,
            "reason": check_reason("pause", reason, required=True),
            "actor": check_actor(actor),
        }
        with self._joined(connection) as conn:
            self._rows("pause_barrier", None, conn)
            created = bool(self._rows("pause_scope", params, conn))
            if cancel_running:
                self._rows("cancel_running_in_scope", params, conn)
        return created

    def resume(
        self,
        queue: str | None = None,
        *,
        task: str | None = None,
        ordering_key: str | None = None,
        reason: str | None = None,
        actor: str | None = None,
        connection: Connection[Any] | None = None,
    ) -> bool:
        """End a pause (audited) and wake the workers. False when the scope was not paused.
        With ``connection=``, it takes effect when the caller's transaction commits."""
        self._refuse_isolation(connection)
        scope, value = scope_of(queue, task, ordering_key)
        params = {
            "scope": scope,
            "value": value,
            "reason": check_reason("resume", reason, required=False),
            "actor": check_actor(actor),
            "channel": self.channel,
        }
        with self._joined(connection) as conn:
            return bool(self._rows("resume_scope", params, conn))

    def pauses(self) -> list[Pause]:
        """The pauses in force (who paused what, when, why, and for how long), by scope
        and value. Also what the database metrics report about pauses."""
        return pauses_from_rows(self._read("list_pauses"))

    def admin_events(
        self, *, scope: str | None = None, value: str | None = None, limit: int = 100
    ) -> list[AdminEvent]:
        """Operator actions that are not about one job (pause, resume, schedule changes),
        newest first; ``scope``/``value`` keep one kind or one target's (e.g.
        ``scope="schedule", value="nightly"``, or ``scope="queue"``)."""
        params = {
            "scope": scope,
            "value": value,
            "limit": validate.check_int("limit", limit, 1, 100_000),
        }
        return admin_events_from_rows(self._read("admin_events", params))

    @contextlib.contextmanager
    def _joined(self, connection: Connection[Any] | None) -> Iterator[Connection[Any]]:
        """A transaction of our own, or the caller's (a savepoint in it; a transaction of
        its own when the caller's connection has none open)."""
        with self._transaction(connection) as conn:
            if connection is None:
                yield conn
                return
            with conn.transaction():
                yield conn
