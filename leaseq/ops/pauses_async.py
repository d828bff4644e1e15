"""Durable pauses: pause and resume a queue, a task or an ordering key, list the pauses in
force and the operator audit trail (``admin_events``).

A pause is a row the claim statement itself checks (claim.sql: ``_not_paused``), so it
holds from its commit, through worker restarts and deploys; no claim of the scope commits
after the pause did (the barrier in ``pause_barrier``). Running jobs keep their leases and
finish, unless ``cancel_running`` asks them to stop.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from psycopg import AsyncConnection

from leaseq import validate
from leaseq.ops.base_async import AsyncClientBase
from leaseq.rules.pauses import (
    AdminEvent,
    Pause,
    admin_events_from_rows,
    check_actor,
    check_reason,
    pauses_from_rows,
    scope_of,
)


class AsyncPauseOps(AsyncClientBase):
    async def pause(
        self,
        queue: str | None = None,
        *,
        task: str | None = None,
        ordering_key: str | None = None,
        reason: str,
        actor: str | None = None,
        cancel_running: bool = False,
        connection: AsyncConnection[Any] | None = None,
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
        await self._refuse_isolation(connection)
        scope, value = scope_of(queue, task, ordering_key)
        params = {
            "scope": scope,
            "value": value,
            "reason": check_reason("pause", reason, required=True),
            "actor": check_actor(actor),
        }
        async with self._joined(connection) as conn:
            await self._rows("pause_barrier", None, conn)
            created = bool(await self._rows("pause_scope", params, conn))
            if cancel_running:
                await self._rows("cancel_running_in_scope", params, conn)
        return created

    async def resume(
        self,
        queue: str | None = None,
        *,
        task: str | None = None,
        ordering_key: str | None = None,
        reason: str | None = None,
        actor: str | None = None,
        connection: AsyncConnection[Any] | None = None,
    ) -> bool:
        """End a pause (audited) and wake the workers. False when the scope was not paused.
        With ``connection=``, it takes effect when the caller's transaction commits."""
        await self._refuse_isolation(connection)
        scope, value = scope_of(queue, task, ordering_key)
        params = {
            "scope": scope,
            "value": value,
            "reason": check_reason("resume", reason, required=False),
            "actor": check_actor(actor),
            "channel": self.channel,
        }
        async with self._joined(connection) as conn:
            return bool(await self._rows("resume_scope", params, conn))

    async def pauses(self) -> list[Pause]:
        """The pauses in force (who paused what, when, why, and for how long), by scope
        and value. Also what the database metrics report about pauses."""
        return pauses_from_rows(await self._read("list_pauses"))

    async def admin_events(
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
        return admin_events_from_rows(await self._read("admin_events", params))

    @contextlib.asynccontextmanager
    async def _joined(
        self, connection: AsyncConnection[Any] | None
    ) -> AsyncIterator[AsyncConnection[Any]]:
        """A transaction of our own, or the caller's (a savepoint in it; a transaction of
        its own when the caller's connection has none open)."""
        async with self._transaction(connection) as conn:
            if connection is None:
                yield conn
                return
            async with conn.transaction():
                yield conn
