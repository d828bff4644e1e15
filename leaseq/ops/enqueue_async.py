"""Enqueue: one job, many jobs (unnested arrays, or COPY from 200 jobs on), inside the
caller's transaction when given one, and jobs with a unique key (take the key first, then
resolve a conflict as ``on_conflict`` says; the rules are in ``leaseq.rules.unique``). A
job's options, their checks and parameters are declared once, in ``leaseq.jobspec``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Unpack

from psycopg import AsyncConnection

from leaseq.errors import LeaseqError, UniqueConflict
from leaseq.jobspec import (
    COPY_THRESHOLD,
    EnqueueOptions,
    JobSpec,
    copy_row,
    job_arrays,
    job_fields,
    job_params,
)
from leaseq.ops.deps_async import AsyncDepsOps
from leaseq.ops.payloads_async import AsyncPayloadOps
from leaseq.rules.unique import EnqueueResult, holder_state, resolve_conflict, unique_params
from leaseq.tracing import Carrier

#: How often an enqueue tries again when the key's holder changed between its statements.
UNIQUE_ATTEMPTS = 20


class AsyncEnqueueOps(AsyncDepsOps, AsyncPayloadOps):
    async def enqueue(
        self,
        task: str,
        payload: Any = None,
        *,
        connection: AsyncConnection[Any] | None = None,
        **options: Unpack[EnqueueOptions],
    ) -> EnqueueResult:
        """Store one job; returns its id (an :class:`EnqueueResult`, an ``int``).

        With ``connection`` the insert joins that connection's open transaction: the job
        exists, and workers are woken, only if the caller commits. ``payload_version`` tags
        the payload's schema, for tasks that accept only some versions. ``idempotency_key``
        becomes the job's ``ctx.idempotency_key`` (default: derived from the job id).
        Jobs sharing an ``ordering_key`` run one at a time, in enqueue order; when one ends
        dead, ``key_policy`` says whether its key waits (``block``) or moves on (``skip``).

        ``unique_key``: at most one live job (pending or running) holds the key, and with
        ``unique_for`` (seconds or a timedelta) the key stays held that long after the job
        finished in one of ``unique_states``. When the key is held, ``on_conflict`` says
        what happens: ``skip`` (default) returns the holder's id with ``inserted`` false,
        ``raise`` raises :class:`UniqueConflict`, ``replace`` updates a pending holder or
        queues a follow-up behind a running one. ``debounce`` (implies replace) starts the
        job that long after the latest enqueue, but no later than ``debounce_max`` after
        the first. See docs/unique.md.

        ``limit_key``: the job is also under the limit ``key:<limit_key>`` (or its family,
        e.g. ``key:customer:*``), besides its queue's and task's. See docs/limits.md.
        ``depends_on``: job ids (or :class:`~leaseq.Dep` with a policy of its own) this job
        waits for; it runs once all of them ended, and ``on_dead`` says what a dependency
        that ends dead or cancelled does: ``cancel`` this job (default), ``run`` it anyway,
        or ``ignore`` that dependency. An unknown id is refused. ``batch_id``: the job
        joins that open batch (see ``batch()``). See docs/workflows.md.
        """
        await self._refuse_isolation(connection)
        fields = job_fields({"task": task, "payload": payload, **options})
        params = job_params(fields, self.payload_limit, self._payload_sealer())
        params["channel"] = self.channel
        if params["fairness_key"] is not None:
            # Its key's row is touched after the insert, in the same transaction.
            async with self._transaction(connection) as conn:
                result = await self._enqueue_one(params, conn)
                await self._touch_fair_keys(conn, [params])
            return result
        return await self._enqueue_one(params, connection)

    async def _enqueue_one(
        self, params: dict[str, Any], connection: AsyncConnection[Any] | None
    ) -> EnqueueResult:
        uploaded = await self._offload([params])
        if self.tracing is None and not self._stores_payloads([params]):
            return await self._insert_one(params, connection)
        return (await self._enqueue_together([params], connection, uploaded, single=True))[0]

    async def _enqueue_together(
        self,
        params_list: list[dict[str, Any]],
        connection: AsyncConnection[Any] | None,
        uploaded: list[str],
        *,
        single: bool,
    ) -> list[EnqueueResult]:
        """The inserts, the offloaded payloads' rows and the tracing context, in one
        transaction (the caller's, when given). Objects uploaded for an enqueue that does
        not commit, or that no job took (a unique key held), are deleted again."""
        unused: list[str] = []
        try:
            if self.tracing is None:
                async with self._transaction(connection) as conn:
                    ids = await self._insert_some(params_list, conn, single)
                    unused = await self._store_offloaded(conn, ids, params_list)
            else:
                jobs = [(p["queue"], p["task"]) for p in params_list]
                with self.tracing.send(jobs) as scope:
                    async with self._transaction(connection) as conn:
                        ids = await self._insert_some(params_list, conn, single)
                        unused = await self._store_offloaded(conn, ids, params_list)
                        # A conflict stored nothing: the holder keeps its trace.
                        fresh = [
                            (i, c) for i, c in zip(ids, scope.carriers, strict=True) if i.inserted
                        ]
                        await self._set_trace_contexts(
                            conn, [i for i, _ in fresh], [c for _, c in fresh]
                        )
                    scope.sent(ids)
        except BaseException:
            await self._discard_objects(uploaded)
            raise
        await self._discard_objects(unused)
        return ids

    async def _insert_some(
        self, params_list: list[dict[str, Any]], conn: AsyncConnection[Any], single: bool
    ) -> list[EnqueueResult]:
        if single:
            return [await self._insert_one(params_list[0], conn)]
        return await self._insert_many(params_list, conn)

    async def _insert_one(
        self, params: dict[str, Any], connection: AsyncConnection[Any] | None
    ) -> EnqueueResult:
        if params["deps"] is not None or params["batch_id"] is not None:
            return (await self._enqueue_with_deps([params], connection))[0]
        if params["unique"] is not None:
            if params["ordering_key"] is None:
                # Each statement is atomic and fenced on its own: no transaction needed.
                return await self._enqueue_unique(connection, params)
            async with self._transaction(connection) as conn:
                await self._lock_keys(conn, [params["ordering_key"]])
                return await self._enqueue_unique(conn, params)
        if params["ordering_key"] is None:
            del params["ordering_key"]
            rows = await self._rows("insert_job", params, connection)
        else:
            async with self._transaction(connection) as conn:
                await self._lock_keys(conn, [params["ordering_key"]])
                rows = await self._rows("insert_keyed_job", params, conn)
        return EnqueueResult.new(rows[0][0])

    async def _enqueue_unique(
        self, conn: AsyncConnection[Any] | None, job: dict[str, Any]
    ) -> EnqueueResult:
        """Take the job's unique key and insert it, or resolve the conflict. Each statement
        is fenced on the holder it read: if the holder changed in between, try again.
        ``conn`` None: each statement in its own transaction (a pooled connection)."""
        params = unique_params(job)
        unique = job["unique"]
        for _ in range(UNIQUE_ATTEMPTS):
            rows = await self._rows("insert_unique_job", params, conn)
            if rows:
                return EnqueueResult(rows[0][0])
            # A new statement, a new snapshot: the holder may have committed after the
            # insert's snapshot was taken.
            found = await self._rows("unique_holder", params, conn)
            if not found:
                continue  # let go meanwhile: take it now
            if found[0][3]:  # only a window that has ended
                if rows := await self._rows("take_unique_window", params, conn):
                    return EnqueueResult(rows[0][0])
                continue
            holder, held_until, status, _ = found[0]
            state = holder_state(status, held_until)
            outcome = resolve_conflict(unique.on_conflict, state, held_until is not None)
            self._count_conflict(outcome)
            if outcome == "raise":
                raise UniqueConflict(unique.key, holder, state)
            if outcome == "skip":
                return EnqueueResult(holder, inserted=False, conflict_state=state, outcome=outcome)
            if outcome == "replace":
                if await self._rows("unique_replace", {**params, "holder": holder}, conn):
                    return EnqueueResult(
                        holder,
                        inserted=False,
                        replaced=True,
                        conflict_state=state,
                        outcome=outcome,
                    )
                continue  # claimed or cancelled meanwhile
            # The key row locked first, then the follow-up decided with a new snapshot: a
            # holder that stopped running meanwhile is seen so (insert_follow_up).
            async with self._transaction(conn) as tx:
                fenced = {**params, "holder": holder}
                if await self._rows("lock_unique_key", fenced, tx):
                    rows = await self._rows("insert_follow_up", fenced, tx)
                    if rows:
                        return EnqueueResult(rows[0][0], conflict_state=state, outcome=outcome)
        raise LeaseqError(
            f"unique key {unique.key!r} changed hands {UNIQUE_ATTEMPTS} times during one "
            "enqueue; try again"
        )

    def _count_conflict(self, outcome: str) -> None:
        """Counted in the enqueuing process (``leaseq_unique_conflicts_total``)."""
        self.unique_conflicts[outcome] = self.unique_conflicts.get(outcome, 0) + 1

    async def _touch_fair_keys(
        self, conn: AsyncConnection[Any], params_list: Sequence[Mapping[str, Any]]
    ) -> None:
        """After the insert of jobs with fairness keys, in its transaction: their keys'
        rows created or unparked (touch_fair_keys)."""
        pairs = sorted({(p["queue"], p["fairness_key"]) for p in params_list if p["fairness_key"]})
        params = {"queues": [q for q, _ in pairs], "keys": [k for _, k in pairs]}
        await self._rows("touch_fair_keys", params, conn)

    async def _set_trace_contexts(
        self, conn: AsyncConnection[Any], ids: list[int], carriers: Sequence[Carrier | None]
    ) -> None:
        """Store the tracing hooks' carriers with the jobs just inserted (same transaction)."""
        found = [(i, json.dumps(c)) for i, c in zip(ids, carriers, strict=True) if c]
        if found:
            params = {"ids": [i for i, _ in found], "carriers": [c for _, c in found]}
            await self._rows("set_trace_contexts", params, conn)

    async def enqueue_many(
        self,
        jobs: Iterable[JobSpec | Mapping[str, Any]],
        *,
        connection: AsyncConnection[Any] | None = None,
    ) -> list[EnqueueResult]:
        """Store many jobs in one statement; returns their ids in input order.

        Each item is a :class:`JobSpec` or a mapping with ``enqueue``'s argument names.
        All are validated before anything is sent, so a bad item stores nothing. With unique
        keys, the items are enqueued one by one in one transaction: a key repeated in the
        batch resolves to its first item's job (as a later ``enqueue`` would).
        """
        await self._refuse_isolation(connection)
        seal = self._payload_sealer()
        params_list = [job_params(job_fields(job), self.payload_limit, seal) for job in jobs]
        if not params_list:
            return []
        if any(p["fairness_key"] is not None for p in params_list):
            async with self._transaction(connection) as conn:
                results = await self._enqueue_list(params_list, conn)
                await self._touch_fair_keys(conn, params_list)
            return results
        return await self._enqueue_list(params_list, connection)

    async def _enqueue_list(
        self, params_list: list[dict[str, Any]], connection: AsyncConnection[Any] | None
    ) -> list[EnqueueResult]:
        uploaded = await self._offload(params_list)
        if self.tracing is None and not self._stores_payloads(params_list):
            return await self._insert_many(params_list, connection)
        return await self._enqueue_together(params_list, connection, uploaded, single=False)

    async def _insert_many(
        self, params_list: list[dict[str, Any]], connection: AsyncConnection[Any] | None
    ) -> list[EnqueueResult]:
        if any(p["deps"] is not None or p["batch_id"] is not None for p in params_list):
            return await self._enqueue_with_deps(params_list, connection)
        return await self._insert_rows(params_list, connection)

    async def _enqueue_with_deps(
        self, params_list: list[dict[str, Any]], connection: AsyncConnection[Any] | None
    ) -> list[EnqueueResult]:
        """Jobs with dependencies or a batch: inserted as usual, then joined to their
        batches and their edges stored and decided, all in one transaction (a savepoint in
        the caller's): an unknown dependency or a batch not open stores nothing."""
        self._check_deps(params_list)
        async with self._transaction(connection) as outer, outer.transaction():
            results = await self._insert_rows(params_list, outer)
            ids = [int(r) for r in results]
            # Dependencies (job rows) are locked before the batch row, the order an ending
            # takes too (its job, then its batch), so the two cannot deadlock.
            if any(p["deps"] is not None for p in params_list):
                await self._store_deps(outer, params_list, ids)
            await self._join_batches(outer, params_list, ids)
        return results

    async def _insert_rows(
        self, params_list: list[dict[str, Any]], connection: AsyncConnection[Any] | None
    ) -> list[EnqueueResult]:
        if any(p["unique"] is not None for p in params_list):
            return await self._enqueue_each(params_list, connection)
        keyed = any(p["ordering_key"] for p in params_list)
        if not keyed and len(params_list) >= COPY_THRESHOLD:
            async with self._transaction(connection) as conn:
                return await self._copy_jobs(conn, params_list)
        arrays = job_arrays(params_list, self.channel)
        if not keyed:
            rows = await self._rows("insert_jobs", arrays, connection)
        else:
            async with self._transaction(connection) as conn:
                await self._lock_keys(conn, arrays["ordering_key"])
                rows = await self._rows("insert_jobs", arrays, conn)
        return [EnqueueResult.new(row[0]) for row in rows]

    async def _enqueue_each(
        self, params_list: list[dict[str, Any]], connection: AsyncConnection[Any] | None
    ) -> list[EnqueueResult]:
        results = []
        async with self._transaction(connection) as conn:
            await self._lock_keys(conn, [p["ordering_key"] for p in params_list])
            for params in params_list:
                params["channel"] = self.channel
                if params["unique"] is not None:
                    results.append(await self._enqueue_unique(conn, params))
                    continue
                name = "insert_job" if params["ordering_key"] is None else "insert_keyed_job"
                rows = await self._rows(name, params, conn)
                results.append(EnqueueResult(rows[0][0]))
        return results

    async def _copy_jobs(
        self, conn: AsyncConnection[Any], params_list: list[dict[str, Any]]
    ) -> list[EnqueueResult]:
        """Bulk enqueue through COPY (about 3x an insert of unnested arrays): ids reserved
        first, so they are returned in input order; delays count from the database clock."""
        ready = sorted({p["queue"] for p in params_list if p["run_at"] is None and not p["delay"]})
        params = {"n": len(params_list), "queues": ready, "channel": self.channel}
        ((db_now, ids, _),) = await self._rows("reserve_job_ids", params, conn)
        cur = conn.cursor()
        async with cur.copy(self.queries["copy_jobs"]) as copy:
            for job_id, p in zip(ids, params_list, strict=True):
                await copy.write_row(copy_row(job_id, p, db_now))
        return [EnqueueResult.new(i) for i in ids]
