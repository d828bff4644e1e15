# Generated from leaseq/ops/enqueue_async.py by tools/gen_sync.py. Do not edit by hand:
# change the async source and run `python tools/gen_sync.py`.
"""Enqueue: one job, many jobs (unnested arrays, or COPY from 200 jobs on), inside the
caller's transaction when given one. Checks and parameters come from ``leaseq.params``.

The synchronous twin of ``leaseq/ops/enqueue_async.py``; see that file for the logic.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from psycopg import Connection

from leaseq.models import JobSpec
from leaseq.ops.base import ClientBase
from leaseq.params import COPY_THRESHOLD, copy_row, job_arrays, job_fields, job_params
from leaseq.tracing import Carrier


class EnqueueOps(ClientBase):
    def enqueue(
        self,
        task: str,
        payload: Any = None,
        *,
        queue: str = "default",
        priority: int = 0,
        run_at: Any = None,
        delay: Any = None,
        max_attempts: int = 8,
        payload_version: int | None = None,
        idempotency_key: str | None = None,
        ordering_key: str | None = None,
        key_policy: str = "block",
        connection: Connection[Any] | None = None,
    ) -> int:
        """Store one job; returns its id.

        With ``connection`` the insert joins that connection's open transaction: the job
        exists, and workers are woken, only if the caller commits. ``payload_version`` tags
        the payload's schema, for tasks that accept only some versions. ``idempotency_key``
        becomes the job's ``ctx.idempotency_key`` (default: derived from the job id).
        Jobs sharing an ``ordering_key`` run one at a time, in enqueue order; when one ends
        dead, ``key_policy`` says whether its key waits (``block``) or moves on (``skip``).
        """
        params = job_params(
            {
                "task": task,
                "payload": payload,
                "queue": queue,
                "priority": priority,
                "run_at": run_at,
                "delay": delay,
                "max_attempts": max_attempts,
                "payload_version": payload_version,
                "idempotency_key": idempotency_key,
                "ordering_key": ordering_key,
                "key_policy": key_policy,
            },
            self.payload_limit,
        )
        params["channel"] = self.channel
        if self.tracing is None:
            return self._insert_one(params, connection)
        with self.tracing.send([(params["queue"], params["task"])]) as scope:
            with self._transaction(connection) as conn:
                job_id = self._insert_one(params, conn)
                self._set_trace_contexts(conn, [job_id], scope.carriers)
            scope.sent([job_id])
        return job_id

    def _insert_one(self, params: dict[str, Any], connection: Connection[Any] | None) -> int:
        if params["ordering_key"] is None:
            del params["ordering_key"]
            rows = self._rows("insert_job", params, connection)
        else:
            with self._transaction(connection) as conn:
                self._lock_keys(conn, [params["ordering_key"]])
                rows = self._rows("insert_keyed_job", params, conn)
        return int(rows[0][0])

    def _set_trace_contexts(
        self, conn: Connection[Any], ids: list[int], carriers: Sequence[Carrier | None]
    ) -> None:
        """Store the tracing hooks' carriers with the jobs just inserted (same transaction)."""
        found = [(i, json.dumps(c)) for i, c in zip(ids, carriers, strict=True) if c]
        if found:
            params = {"ids": [i for i, _ in found], "carriers": [c for _, c in found]}
            self._rows("set_trace_contexts", params, conn)

    def enqueue_many(
        self,
        jobs: Iterable[JobSpec | Mapping[str, Any]],
        *,
        connection: Connection[Any] | None = None,
    ) -> list[int]:
        """Store many jobs in one statement; returns their ids in input order.

        Each item is a :class:`JobSpec` or a mapping with ``enqueue``'s argument names.
        All are validated before anything is sent, so a bad item stores nothing.
        """
        params_list = [job_params(job_fields(job), self.payload_limit) for job in jobs]
        if not params_list:
            return []
        if self.tracing is None:
            return self._insert_many(params_list, connection)
        with self.tracing.send([(p["queue"], p["task"]) for p in params_list]) as scope:
            with self._transaction(connection) as conn:
                ids = self._insert_many(params_list, conn)
                self._set_trace_contexts(conn, ids, scope.carriers)
            scope.sent(ids)
        return ids

    def _insert_many(
        self, params_list: list[dict[str, Any]], connection: Connection[Any] | None
    ) -> list[int]:
        keyed = any(p["ordering_key"] for p in params_list)
        if not keyed and len(params_list) >= COPY_THRESHOLD:
            with self._transaction(connection) as conn:
                return self._copy_jobs(conn, params_list)
        arrays = job_arrays(params_list, self.channel)
        if not keyed:
            rows = self._rows("insert_jobs", arrays, connection)
        else:
            with self._transaction(connection) as conn:
                self._lock_keys(conn, arrays["ordering_keys"])
                rows = self._rows("insert_jobs", arrays, conn)
        return [int(row[0]) for row in rows]

    def _copy_jobs(self, conn: Connection[Any], params_list: list[dict[str, Any]]) -> list[int]:
        """Bulk enqueue through COPY (about 3x an insert of unnested arrays): ids reserved
        first, so they are returned in input order; delays count from the database clock."""
        ready = sorted({p["queue"] for p in params_list if p["run_at"] is None and not p["delay"]})
        params = {"n": len(params_list), "queues": ready, "channel": self.channel}
        ((db_now, ids, _),) = self._rows("reserve_job_ids", params, conn)
        cur = conn.cursor()
        with cur.copy(self.queries["copy_jobs"]) as copy:
            for job_id, p in zip(ids, params_list, strict=True):
                copy.write_row(copy_row(job_id, p, db_now))
        return [int(i) for i in ids]
