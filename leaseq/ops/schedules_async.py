"""Periodic schedules: the ticker's round (one transaction per due schedule), code schedules
synced at worker start, and the operator's changes (add, change, enable, disable, remove,
run now), each audited in ``admin_events``. Tick arithmetic is pure
(``leaseq.rules.schedule_timing``, ``leaseq.rules.schedules``); this module only moves rows.

The one rule everything here keeps: a schedule's jobs are created only by a transaction
holding that schedule's row lock, and each through ``tick_job``, whose unique tick row makes
a second job for the same tick impossible whatever any process believes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import json
from collections.abc import Iterable, Sequence
from typing import Any

from psycopg import AsyncConnection

from leaseq import validate
from leaseq.codec import is_sealed
from leaseq.errors import ConfigError, EncryptionError
from leaseq.ops.payloads_async import AsyncPayloadOps
from leaseq.rules.schedules import (
    ORDERING_PREFIX,
    Schedule,
    ScheduleDef,
    TickRecord,
    TickRound,
    changed,
    schedule_def,
    schedule_from_row,
    tick_key,
)

UNFINISHED = ("pending", "running")


class AsyncScheduleOps(AsyncPayloadOps):
    # -- the ticker ---------------------------------------------------------------------

    async def tick_schedules(self, *, limit: int = 100) -> TickRound:
        """Enqueue the due ticks of up to ``limit`` schedules, one transaction each, and say
        how long until the next one is due. Safe in any number of processes at once."""
        result = TickRound()
        while result.schedules < limit:
            async with self._transaction() as conn:
                rows = await self._rows("lock_due_schedule", None, conn)
                if not rows:
                    break
                await self._run_ticks(conn, schedule_from_row(rows[0]), result)
            result.schedules += 1
        ((next_in,),) = await self._rows("next_tick_in")
        result.next_in = next_in
        return result

    async def _run_ticks(
        self, conn: AsyncConnection[Any], schedule: Schedule, result: TickRound
    ) -> None:
        """Under the schedule's row lock: its due ticks, by its policies, then advance it."""
        d = schedule.definition
        try:
            due = schedule.due()
        except Exception as exc:
            # Never let one schedule stall every ticker (it would stay the earliest due).
            detail = f"cannot compute its ticks: {type(exc).__name__}: {exc}"
            await self._rows("park_schedule", {"name": d.name, "actor": "ticker"}, conn)
            await self._audit(conn, "ticker", "schedule.disable", d.name, "false", detail)
            result.parked += 1
            return
        last_job = schedule.last_job_id
        unfinished = schedule.last_job_status in UNFINISHED
        key = ORDERING_PREFIX + d.name if d.overlap == "queue" else None
        if key is not None and due.ticks:
            await self._lock_keys(conn, [key])
        last_tick: dt.datetime | None = None
        skipped = 0
        for tick_at, catch_up in due.ticks:
            last_tick = tick_at
            if d.overlap == "skip" and unfinished:
                params = {"name": d.name, "tick_at": tick_at, "catch_up": catch_up}
                if await self._rows("skip_tick", {**params, "reason": "overlap"}, conn):
                    skipped += 1
                continue
            job_id = await self._tick_job(conn, d.name, tick_at, catch_up=catch_up, key=key)
            if job_id is not None:
                last_job, unfinished = job_id, True
                result.enqueued += 1
        result.skipped_catch_up += due.skipped
        result.skipped_overlap += skipped
        await self._rows(
            "advance_schedule",
            {
                "name": d.name,
                "last_tick": last_tick,
                "next_tick": due.next_tick,
                "last_job_id": last_job,
                "skipped": due.skipped + skipped,
            },
            conn,
        )

    async def _tick_job(
        self,
        conn: AsyncConnection[Any],
        name: str,
        tick_at: dt.datetime,
        *,
        catch_up: bool,
        key: str | None,
        manual: bool = False,
    ) -> int | None:
        """The tick row and its job, in one statement; None when the tick row existed."""
        params = {
            "name": name,
            "tick_at": tick_at,
            "catch_up": catch_up,
            "manual": manual,
            "idempotency_key": tick_key(name, tick_at, catch_up=catch_up, manual=manual),
            "ordering_key": key,
            "channel": self.channel,
        }
        rows = await self._rows("tick_job", params, conn)
        return int(rows[0][0]) if rows else None

    # -- code schedules -----------------------------------------------------------------

    async def sync_code_schedules(
        self, declared: Sequence[ScheduleDef], tasks: Iterable[str], *, actor: str | None = None
    ) -> tuple[list[str], list[str]]:
        """Upsert the schedules an app declares (at worker start) and disable the code
        schedules of ``tasks`` it no longer declares. Returns (names refused because a
        dynamic schedule holds them, names disabled)."""
        refused: list[str] = []
        async with self._transaction() as conn:
            ((now,),) = await self._rows("db_now", None, conn)
            stored = {}
            if self.encryption is not None:
                stored = {
                    r.name: r.definition.payload
                    for r in map(
                        schedule_from_row, await self._rows("list_schedules", {"name": None}, conn)
                    )
                }
            for d in sorted(declared, key=lambda d: d.name):
                params = self._schedule_params(
                    d, d.timing.next_after(now), actor, stored.get(d.name)
                )
                if not await self._rows("upsert_code_schedule", params, conn):
                    refused.append(d.name)
            params = {
                "actor": actor,
                "tasks": sorted(set(tasks)),
                "names": [d.name for d in declared],
            }
            disabled = [
                row[0] for row in await self._rows("disable_undeclared_schedules", params, conn)
            ]
            for name in disabled:
                await self._audit(
                    conn, actor, "schedule.disable", name, "false", "no longer declared in code"
                )
        return refused, disabled

    # -- reading ------------------------------------------------------------------------

    async def schedules(self, name: str | None = None) -> list[Schedule]:
        """Every stored schedule (or the one named), with its last job's status."""
        return [schedule_from_row(r) for r in await self._read("list_schedules", {"name": name})]

    async def schedule_ticks(self, name: str, *, limit: int = 50) -> list[TickRecord]:
        """A schedule's most recent ticks, newest first (skipped ones with their reason)."""
        params = {"name": name, "limit": validate.check_int("limit", limit, 1, 100_000)}
        return [TickRecord(*row) for row in await self._read("schedule_ticks", params)]

    # -- changing -----------------------------------------------------------------------

    async def schedule_add(
        self,
        name: str,
        *,
        task: str,
        cron: str | None = None,
        every: Any = None,
        tz: str = "UTC",
        payload: Any = None,
        queue: str = "default",
        priority: int = 0,
        max_attempts: int = 8,
        catch_up: str = "latest",
        catch_up_max: int = 100,
        grace: float = 600.0,
        overlap: str = "allow",
        enabled: bool = True,
        cost: int = 1,
        actor: str | None = None,
        reason: str | None = None,
        connection: AsyncConnection[Any] | None = None,
    ) -> Schedule:
        """Add a dynamic schedule (audited); its first tick is the first after now. A name
        already taken is a ConfigError."""
        await self._refuse_isolation(connection)
        d = schedule_def(
            name,
            task,
            cron=cron,
            every=every,
            tz=tz,
            payload=payload,
            queue=queue,
            priority=priority,
            max_attempts=max_attempts,
            catch_up=catch_up,
            catch_up_max=catch_up_max,
            grace=grace,
            overlap=overlap,
            enabled=enabled,
            cost=cost,
        )
        async with self._transaction(connection) as conn:
            ((now,),) = await self._rows("db_now", None, conn)
            params = self._schedule_params(d, d.timing.next_after(now), actor)
            if not await self._rows("insert_schedule", params, conn):
                raise ConfigError(f"a schedule named {name!r} already exists")
            await self._audit(conn, actor, "schedule.add", name, d.timing.describe(), reason)
            return schedule_from_row((await self._rows("list_schedules", {"name": name}, conn))[0])

    async def schedule_change(
        self,
        name: str,
        *,
        task: str | None = None,
        cron: str | None = None,
        every: Any = None,
        tz: str | None = None,
        payload: Any = None,
        queue: str | None = None,
        priority: int | None = None,
        max_attempts: int | None = None,
        catch_up: str | None = None,
        catch_up_max: int | None = None,
        grace: float | None = None,
        overlap: str | None = None,
        cost: int | None = None,
        actor: str | None = None,
        reason: str | None = None,
        connection: AsyncConnection[Any] | None = None,
    ) -> Schedule:
        """Change a dynamic schedule (audited); what is None stays. A new timing takes
        effect from now: its next tick is the first after now."""
        await self._refuse_isolation(connection)
        changes = {
            "task": task,
            "cron": cron,
            "every": every,
            "tz": tz,
            "payload": payload,
            "queue": queue,
            "priority": priority,
            "max_attempts": max_attempts,
            "catch_up": catch_up,
            "catch_up_max": catch_up_max,
            "grace": grace,
            "overlap": overlap,
            "cost": cost,
        }
        async with self._transaction(connection) as conn:
            current = await self._locked(conn, name)
            if current.source == "code":
                raise ConfigError(
                    f"schedule {name!r} is declared in code: change it there "
                    "(enable and disable work on it here)"
                )
            new = changed(current.definition, changes)
            await self._store(conn, current, new, actor)
            detail = ", ".join(sorted(k for k, v in changes.items() if v is not None))
            await self._audit(
                conn, actor, "schedule.change", name, new.timing.describe(), reason, detail
            )
            return schedule_from_row((await self._rows("list_schedules", {"name": name}, conn))[0])

    async def schedule_enable(
        self,
        name: str,
        *,
        reason: str | None = None,
        actor: str | None = None,
        connection: AsyncConnection[Any] | None = None,
    ) -> bool:
        """Enable a schedule (audited); ticks missed while it was disabled are not caught
        up. False when it was enabled already."""
        await self._refuse_isolation(connection)
        return await self._set_enabled(name, True, reason, actor, connection)

    async def schedule_disable(
        self,
        name: str,
        *,
        reason: str | None = None,
        actor: str | None = None,
        connection: AsyncConnection[Any] | None = None,
    ) -> bool:
        """Disable a schedule (audited): no tick creates a job until it is enabled again.
        False when it was disabled already."""
        await self._refuse_isolation(connection)
        return await self._set_enabled(name, False, reason, actor, connection)

    async def schedule_remove(
        self,
        name: str,
        *,
        reason: str | None = None,
        actor: str | None = None,
        connection: AsyncConnection[Any] | None = None,
    ) -> bool:
        """Delete a dynamic schedule and its tick history (audited; its jobs stay). A code
        schedule cannot be removed here (the next worker start would bring it back):
        disable it. False when there is no such schedule."""
        await self._refuse_isolation(connection)
        async with self._transaction(connection) as conn:
            found = await self._rows("lock_schedule", {"name": name}, conn)
            if not found:
                return False
            if schedule_from_row(found[0]).source == "code":
                raise ConfigError(
                    f"schedule {name!r} is declared in code: remove it there, or disable it"
                )
            await self._rows("delete_schedule", {"name": name}, conn)
            await self._audit(conn, actor, "schedule.remove", name, None, reason)
            return True

    async def schedule_run_now(
        self,
        name: str,
        *,
        reason: str | None = None,
        actor: str | None = None,
        connection: AsyncConnection[Any] | None = None,
    ) -> int:
        """Enqueue one job for the schedule now, outside its timing (audited); returns its
        id. It counts as the schedule's last job (overlap ``skip`` waits for it, ``queue``
        orders it) but leaves the next tick where it was."""
        await self._refuse_isolation(connection)
        async with self._transaction(connection) as conn:
            current = await self._locked(conn, name)
            d = current.definition
            key = ORDERING_PREFIX + d.name if d.overlap == "queue" else None
            if key is not None:
                await self._lock_keys(conn, [key])
            job_id = await self._tick_job(
                conn, name, current.read_at, catch_up=False, key=key, manual=True
            )
            if job_id is None:
                raise ConfigError(f"schedule {name!r} ticked at this very instant; run it again")
            params = {
                "name": name,
                "last_tick": None,
                "next_tick": current.next_tick,
                "last_job_id": job_id,
                "skipped": 0,
            }
            await self._rows("advance_schedule", params, conn)
            await self._audit(conn, actor, "schedule.run", name, str(job_id), reason)
            return job_id

    async def prune_schedule_ticks(self, *, older_than: float, batch_size: int = 1000) -> int:
        """Delete tick rows older than ``older_than`` seconds (at most ``batch_size``)."""
        params = {
            "older_than": validate.check_positive_seconds("older_than", older_than, 1e10),
            "limit": validate.check_int("batch_size", batch_size, 1, 100_000),
        }
        return len(await self._rows("prune_schedule_ticks", params))

    # -- helpers ------------------------------------------------------------------------

    def _schedule_params(
        self, d: ScheduleDef, next_tick: Any, actor: str | None, stored: Any = None
    ) -> dict[str, Any]:
        """A schedule's parameters, its payload sealed when its task encrypts (its tick jobs
        copy it as stored). The stored envelope is kept when it holds the same payload, so a
        code schedule declared again at every worker start does not change."""
        params = d.params(next_tick, actor)
        if self.encryption is None or not self.encryption.applies(d.task) or is_sealed(d.payload):
            return params
        if is_sealed(stored):
            with contextlib.suppress(EncryptionError):
                if self._open(stored, "payload") == d.payload:
                    params["payload"] = json.dumps(stored)
                    return params
        params["payload"] = self.encryption.keyring.seal(d.payload_text, "payload")
        return params

    async def _locked(self, conn: AsyncConnection[Any], name: str) -> Schedule:
        found = await self._rows("lock_schedule", {"name": name}, conn)
        if not found:
            raise ConfigError(f"no schedule named {name!r}")
        return schedule_from_row(found[0])

    async def _store(
        self, conn: AsyncConnection[Any], current: Schedule, new: ScheduleDef, actor: str | None
    ) -> None:
        """Write ``new`` over ``current`` (locked). A changed timing, or enabling, starts
        from now: what was missed meanwhile is not caught up."""
        fresh = new.timing != current.definition.timing or (new.enabled and not current.enabled)
        next_tick = new.timing.next_after(current.read_at) if fresh else current.next_tick
        params = self._schedule_params(new, next_tick, actor, current.definition.payload)
        await self._rows("update_schedule", params, conn)

    async def _set_enabled(
        self,
        name: str,
        enabled: bool,
        reason: str | None,
        actor: str | None,
        connection: AsyncConnection[Any] | None,
    ) -> bool:
        async with self._transaction(connection) as conn:
            current = await self._locked(conn, name)
            if current.enabled == enabled:
                return False
            new = dataclasses.replace(current.definition, enabled=enabled)
            await self._store(conn, current, new, actor)
            action = "schedule.enable" if enabled else "schedule.disable"
            await self._audit(conn, actor, action, name, str(enabled).lower(), reason)
            return True

    async def _audit(
        self,
        conn: AsyncConnection[Any],
        actor: str | None,
        action: str,
        name: str,
        value: str | None,
        reason: str | None,
        detail: str | None = None,
    ) -> None:
        # scope/value name what was acted on, as for pauses; the new setting goes in detail.
        said = "; ".join(part for part in (value, detail) if part)
        params = {
            "actor": actor,
            "action": action,
            "scope": "schedule",
            "value": name,
            "reason": validate.bound_detail(reason),
            "detail": validate.bound_detail(said or None),
        }
        await self._rows("admin_event", params, conn)
