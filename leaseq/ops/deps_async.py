"""Job dependencies: storing a job's edges at enqueue (the dependencies locked and checked,
nothing stored when one is unknown), and reading them back (``jobs show``, metrics). The
promotion of dependents, run by every transition that ends a job, is in ``base_async``.
The rules of ``depends_on`` (ids, :class:`~leaseq.rules.deps.Ref`, policies) are in
``leaseq.rules.deps``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from psycopg import AsyncConnection

from leaseq import validate
from leaseq.errors import ConfigError
from leaseq.models import Dependency
from leaseq.ops.ending_async import AsyncEndingOps
from leaseq.rules.deps import resolve

#: (job id, queue, task, seconds waiting, the unfinished dependencies it waits for)
WaitingJob = tuple[int, str, str, float, list[int]]


class AsyncDepsOps(AsyncEndingOps):
    @staticmethod
    def _check_deps(params_list: Sequence[dict[str, Any]]) -> None:
        """Refuse what cannot be stored, before anything is sent."""
        positions = list(range(len(params_list)))
        for i, params in enumerate(params_list):
            if params["batch_id"] is not None and params["unique"] is not None:
                raise ConfigError("a job in a batch cannot have a unique_key")
            if not params["deps"]:
                continue
            if params["unique"] is not None or params["ordering_key"] is not None:
                raise ConfigError("depends_on cannot be combined with unique_key or ordering_key")
            resolve(i, params["deps"], positions)

    async def _join_batches(
        self, conn: AsyncConnection[Any], params_list: Sequence[dict[str, Any]], ids: list[int]
    ) -> None:
        """Jobs just inserted join their batches, each locked and required to be open."""
        wanted: dict[int, list[int]] = {}
        for job_id, params in zip(ids, params_list, strict=True):
            if params["batch_id"] is not None:
                wanted.setdefault(params["batch_id"], []).append(job_id)
        for batch_id in sorted(wanted):
            found = await self._rows("lock_open_batch", {"id": batch_id}, conn)
            if not found:
                raise ConfigError(f"no batch {batch_id}")
            if found[0][0] != "open":
                raise ConfigError(f"batch {batch_id} is {found[0][0]}: no job can join it")
            await self._rows("join_batch", {"batch_id": batch_id, "ids": wanted[batch_id]}, conn)

    async def _store_deps(
        self, conn: AsyncConnection[Any], params_list: Sequence[dict[str, Any]], ids: list[int]
    ) -> None:
        """The edges of jobs just inserted in ``conn``'s transaction; they wait, and are
        decided at once (their dependencies may have ended already)."""
        edges = [
            (ids[i], target, rule)
            for i, params in enumerate(params_list)
            if params["deps"]
            for target, rule in resolve(i, params["deps"], ids)
        ]
        parents = sorted({target for _, target, _ in edges})
        found = await self._rows("lock_dependency_parents", {"ids": parents}, conn)
        ended = {int(row[0]) for row in found if row[1] in ("succeeded", "dead", "cancelled")}
        unknown = set(parents) - {int(row[0]) for row in found}
        if unknown:
            shown = ", ".join(map(str, sorted(unknown)[:10]))
            raise ConfigError(f"depends_on names job(s) that do not exist: {shown}")
        children = sorted({child for child, _, _ in edges})
        params = {
            "job_ids": [e[0] for e in edges],
            "depends_on": [e[1] for e in edges],
            "on_dead": [e[2] for e in edges],
            "ids": children,
        }
        await self._rows("insert_deps", params, conn)
        # Only a job with an ended dependency can be decided now: the others' dependencies
        # are locked by this transaction, so none can end before it commits, and each one's
        # ending then promotes (has_dependents is set).
        decide = sorted({child for child, target, _ in edges if target in ended})
        if decide:
            await self._promote_dependents(conn, await self._decide_waiting(conn, decide))

    async def dependencies(self, job_id: int) -> list[Dependency]:
        """What a job waits for (or waited for): each dependency with its policy and state."""
        rows = await self._read("job_dependencies", {"id": job_id})
        return [Dependency(int(r[0]), r[1], r[2]) for r in rows]

    async def dependents(self, job_id: int, *, limit: int = 1000) -> list[Dependency]:
        """The jobs that wait for (or waited for) this one, with their policy and state
        (``waiting`` true while they still wait)."""
        params = {"id": job_id, "limit": validate.check_int("limit", limit, 1, 1_000_000)}
        rows = await self._read("job_dependents", params)
        return [Dependency(int(r[0]), r[1], r[2], bool(r[3])) for r in rows]

    async def waiting_jobs(self, *, limit: int = 100) -> list[WaitingJob]:
        """Waiting jobs, oldest first: (id, queue, task, seconds waiting, the unfinished
        dependencies it waits for)."""
        params = {"limit": validate.check_int("limit", limit, 1, 100_000)}
        rows = await self._read("list_waiting", params)
        return [(int(r[0]), r[1], r[2], float(r[3]), list(r[4] or [])) for r in rows]

    async def job_batch(self, job_id: int) -> int | None:
        """The batch a job belongs to, if any."""
        rows = await self._read("job_batch", {"id": job_id})
        return int(rows[0][0]) if rows and rows[0][0] is not None else None

    async def waiting_stats(self) -> tuple[int, float]:
        """Jobs waiting on dependencies, and the oldest such wait in seconds."""
        ((count, oldest),) = await self._read("waiting_stats")
        return int(count), float(oldest)
