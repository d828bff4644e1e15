"""Inspection: jobs, their audit trail and effects, queue and database health. Read-only;
rows are decoded by ``leaseq.rows`` (jobs tolerantly: an unreadable row is shown, not
raised). These reads go to the read replica when the client has one (``read_dsn``), except
those given a ``connection`` (they see its transaction) and those the worker and the
effect records rely on (``queues_have_work``, ``effect_get``: the primary's own state).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, Unpack

from psycopg import AsyncConnection

from leaseq import validate
from leaseq.models import (
    BlockedKey,
    EffectRecord,
    Job,
    JobEvent,
    JobFilter,
    QueueScaling,
    QueueStats,
    UniqueKeyHolder,
)
from leaseq.ops.payloads_async import AsyncPayloadOps
from leaseq.params import job_filter
from leaseq.rows import effect_from_row, event_from_row, job_from_row, stats_from_row
from leaseq.rules.fairness import TOP_KEYS


class AsyncInspectOps(AsyncPayloadOps):
    async def get_job(
        self, job_id: int, *, connection: AsyncConnection[Any] | None = None
    ) -> Job | None:
        """One job, or None. With ``connection`` the read sees that connection's
        transaction; without, it runs on the read replica when there is one."""
        params = {"id": job_id}
        if connection is None:
            rows = await self._read("get_job", params, tolerant=True)
        else:
            rows = await self._rows("get_job", params, connection, tolerant=True)
        return job_from_row(rows[0]) if rows else None

    async def job_events(self, job_id: int) -> list[JobEvent]:
        """The audit trail of one job, oldest first."""
        return [event_from_row(row) for row in await self._read("job_events", {"id": job_id})]

    async def unique_key_holder(self, job_id: int) -> UniqueKeyHolder | None:
        """A job's unique key and who holds it now; None when the job has no key."""
        rows = await self._read("unique_key_of_job", {"id": job_id}, tolerant=True)
        if not rows or rows[0][0] is None:
            return None
        key, holder, held_until = rows[0]
        return UniqueKeyHolder(key, holder, held_until)

    async def list_jobs(
        self,
        status: str = "dead",
        *,
        limit: int = 100,
        connection: AsyncConnection[Any] | None = None,
        **filters: Unpack[JobFilter],
    ) -> list[Job]:
        """Jobs in one state, newest first, filtered by queue, task, error code, and age
        (seconds since they finished: ``older_than`` / ``newer_than``). With ``connection``
        the read sees that connection's uncommitted writes."""
        params = job_filter([status], **filters)
        params["limit"] = validate.check_int("limit", limit, 1, 100_000)
        if connection is None:
            rows = await self._read("list_jobs", params, tolerant=True)
        else:
            rows = await self._rows("list_jobs", params, connection, tolerant=True)
        return [job_from_row(row) for row in rows]

    async def count_jobs(self, status: str = "dead", **filters: Unpack[JobFilter]) -> int:
        """How many jobs ``list_jobs`` (without a limit) would find: a dry run's count."""
        params = job_filter([status], **filters)
        return int((await self._read("count_jobs", params))[0][0])

    async def job_effects(self, job_id: int) -> list[EffectRecord]:
        """The external effects a job declared, with what is known of each."""
        rows = await self._read("job_effects", {"id": job_id})
        return [effect_from_row(row) for row in rows]

    async def effect_get(
        self, job_id: int, name: str, key: str, *, connection: AsyncConnection[Any] | None = None
    ) -> EffectRecord | None:
        rows = await self._rows("effect_get", {"id": job_id, "name": name, "key": key}, connection)
        if not rows:
            return None
        record = effect_from_row(rows[0])
        opened = self._open(record.result, "effect")  # the handler's own record: opened
        return record if opened is record.result else dataclasses.replace(record, result=opened)

    async def queues_have_work(self, queues: Sequence[str]) -> bool:
        """True while any of ``queues`` has a pending (even if scheduled) or running job."""
        rows = await self._rows("queues_have_work", {"queues": list(queues)})
        return bool(rows[0][0])

    async def held_jobs(self, queues: Sequence[str]) -> tuple[int, int]:
        """Due jobs of ``queues`` that nothing can claim now: (behind a pause, held
        otherwise: a limit, an ordering key). A burst worker's exit line reports them."""
        rows = await self._rows("held_jobs", {"queues": list(queues)})
        return int(rows[0][0]), int(rows[0][1])

    async def queue_stats(self, *, throughput: bool = False) -> list[QueueStats]:
        """Per-queue health, from partial indexes only. With ``throughput``, also how many
        jobs each queue finished in the last minute (that part scans recent history)."""
        stats = [stats_from_row(row) for row in await self._read("queue_stats")]
        if not throughput:
            return stats
        recent: dict[str, int] = dict(await self._read("recent_throughput", {"seconds": 60.0}))
        known = {s.queue for s in stats}
        stats += [
            QueueStats(queue, 0, 0, 0, 0, 0.0, 0.0, 0) for queue in recent if queue not in known
        ]
        return sorted(
            (replace(s, finished_recently=int(recent.get(s.queue, 0))) for s in stats),
            key=lambda s: s.queue,
        )

    async def autoscaling(self, queue: str | None = None) -> list[QueueScaling]:
        """Per queue (or only ``queue``): the autoscaling signal, suggested_workers
        included (docs/autoscaling.md)."""
        if queue is not None:
            validate.check_name("queue", queue)
        rows = await self._read("autoscaling", {"queue": queue})
        return [QueueScaling(*row) for row in rows]

    async def database_health(self) -> dict[str, Any]:
        """Expired leases awaiting a sweep, lock waits, connections of leaseq processes,
        the lag of the most overdue schedule, the jobs waiting on dependencies (how
        many, and the oldest wait in seconds), the suspended jobs by queue and reason
        (how many, and how late the most overdue wake-up is) and fair queues' top keys
        (backlog and share)."""
        # On the primary: its pg_stat_activity (lock waits, connections) is the one that
        # matters, and a standby's would show the standby's sessions.
        ((expired, lock_waits, connections),) = await self._rows("database_health")
        lag, waits, suspended, fair = await self._read_together(
            [
                ("schedule_lag", None),
                ("waiting_stats", None),
                ("suspended_stats", None),
                ("fair_key_stats", {"top": TOP_KEYS}),
            ]
        )
        ((schedule_lag,),) = lag
        ((waiting, oldest_wait),) = waits
        return {
            "expired_leases": int(expired),
            "lock_waits": int(lock_waits),
            "connections": dict(connections),
            "schedule_lag": float(schedule_lag),
            "waiting_jobs": int(waiting),
            "oldest_wait": float(oldest_wait),
            # Suspended jobs (docs/durable.md): (queue, reason, count, overdue seconds).
            "suspended": [(str(q), r, int(n), float(o)) for q, r, n, o in suspended],
            # Fair queues' top keys (docs/fairness.md): (queue, key, backlog, share).
            "fair_keys": [(str(q), str(k), int(n), float(w)) for q, k, n, w in fair],
        }

    async def blocked_keys(self, *, limit: int = 100) -> list[BlockedKey]:
        """Ordering keys held up by a dead head (policy ``block``), oldest first."""
        rows = await self._read(
            "blocked_keys", {"limit": validate.check_int("limit", limit, 1, 100_000)}
        )
        return [BlockedKey(*row) for row in rows]
