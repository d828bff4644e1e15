# Generated from leaseq/ops/admin_async.py by tools/gen_sync.py. Do not edit by hand:
# change the async source and run `python tools/gen_sync.py`.
"""Operator actions: cancel, skip a dead head, priority aging, audited replay, purge of dead
jobs and retention. Each takes an actor and a reason where the audit trail wants one, and
works in bounded batches, each its own short transaction.

The synchronous twin of ``leaseq/ops/admin_async.py``; see that file for the logic.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Unpack

from psycopg import Connection

from leaseq import validate
from leaseq.errors import ConfigError, ReplayRefused
from leaseq.models import JobFilter
from leaseq.ops.ending import EndingOps
from leaseq.params import job_filter
from leaseq.rules.unique import ReplayResult


class AdminOps(EndingOps):
    def cancel(
        self,
        job_id: int,
        *,
        actor: str | None = None,
        reason: str | None = None,
        connection: Connection[Any] | None = None,
    ) -> bool:
        """Cancel a pending or suspended job now, or ask its worker to stop a running one;
        the unfinished children it spawned (``ctx.spawn``) are cancelled with it.

        False when the job does not exist or is already finished. With ``connection`` the
        change joins that connection's open transaction (never committed here).
        """
        self._refuse_isolation(connection)
        params = {"id": job_id, "actor": actor, "reason": validate.bound_detail(reason)}
        found = self._rows("job_key", {"id": job_id}, connection)
        keys = [found[0][0]] if found else []
        with self._transaction(connection) as conn:
            rows = self._change_jobs("cancel_job", params, keys, conn)
            # A cancelled job's dependents are decided in the same transaction.
            self._promote_dependents(conn, [int(r[0]) for r in rows if r[1] == "cancelled"])
            if rows:
                # Its unfinished children (ctx.spawn) are cancelled with it, same transaction.
                found = self._rows("unfinished_children", {"id": job_id}, conn)
                for (child,) in found:
                    self.cancel(int(child), actor=actor, reason=reason, connection=conn)
        return bool(rows)

    def run_now(self, job_id: int, *, actor: str | None = None, reason: str | None = None) -> bool:
        """Make a scheduled pending job (a retry waiting out its back-off, a delayed job)
        due now. False when the job is not pending or already due."""
        params = {
            "id": job_id,
            "actor": actor,
            "reason": validate.bound_detail(reason),
            "channel": self.channel,
        }
        return bool(self._rows("run_now", params))

    def set_scaling(
        self,
        queue: str,
        *,
        concurrency: int,
        min_workers: int = 0,
        max_workers: int | None = None,
        actor: str | None = None,
    ) -> None:
        """Tell the autoscaling signal how many handlers one worker of ``queue`` runs
        (its ``WorkerConfig.concurrency``) and the bounds of its worker count."""
        params = {
            "queue": validate.check_name("queue", queue),
            "concurrency": validate.check_int("concurrency", concurrency, 1, 10_000),
            "min_workers": validate.check_int("min_workers", min_workers, 0, 100_000),
            "max_workers": None
            if max_workers is None
            else validate.check_int("max_workers", max_workers, max(min_workers, 1), 100_000),
            "actor": None if actor is None else str(actor)[:200],
        }
        self._rows("set_queue_scaling", params)

    def clear_scaling(self, queue: str) -> bool:
        """Forget ``queue``'s scaling setting (the defaults apply again)."""
        rows = self._rows("clear_queue_scaling", {"queue": validate.check_name("queue", queue)})
        return bool(rows)

    def skip_dead_head(
        self,
        job_id: int,
        *,
        reason: str,
        actor: str | None = None,
        connection: Connection[Any] | None = None,
    ) -> bool:
        """Let an ordering key move past its dead head (which stays dead); audited.
        False when the job is not a dead, keyed, not-yet-skipped job."""
        self._refuse_isolation(connection)
        if not isinstance(reason, str) or not reason.strip():
            raise ConfigError("skipping a dead head needs a reason")
        found = self._rows("job_key", {"id": job_id}, connection)
        if not found or found[0][0] is None:
            return False
        params = {"id": job_id, "actor": actor, "reason": validate.bound_detail(reason)}
        return bool(self._change_jobs("skip_dead_head", params, [found[0][0]], connection))

    def age_priorities(self, *, interval: float, batch_size: int = 1000) -> int:
        """Priority aging: raise the priority of jobs claimable for a whole ``interval``
        or more (see the age_priorities statement); returns how many moved up."""
        params = {
            "interval": validate.check_positive_seconds("interval", interval, 86400.0),
            "limit": validate.check_int("batch_size", batch_size, 1, 100_000),
        }
        total = 0
        while moved := len(self._rows("age_priorities", params)):
            total += moved
            if moved < params["limit"]:
                break
        return total

    def replay(
        self,
        job_id: int,
        *,
        reason: str,
        actor: str | None = None,
        allow_cancelled: bool = False,
        connection: Connection[Any] | None = None,
        with_dependents: bool = False,
    ) -> bool:
        """Bring a dead job back to pending under the same id with a fresh attempt budget.

        ``reason`` is required and stored with ``actor`` in the audit trail. False when the
        job does not exist or is not dead (or cancelled, with ``allow_cancelled``). A job
        whose unique key another job holds is not replayed: the refusal is audited
        (``replay_refused``) and :class:`ReplayRefused` names the holder.
        ``with_dependents``: the jobs cancelled because this one ended (DEPENDENCY_FAILED),
        and theirs in turn, come back too, waiting for it again (same transaction, audited). With
        ``connection`` the replay joins that connection's open transaction.
        """
        self._refuse_isolation(connection)
        statuses = ["dead", "cancelled"] if allow_cancelled else ["dead"]
        params = job_filter(statuses, job_id=job_id)
        refused: list[tuple[int, int | None, str]] = []
        done = self._replay_batch(params, reason, actor, 1, refused, connection, with_dependents)
        if refused:
            raise ReplayRefused(refused[0][0], refused[0][2], refused[0][1])
        return bool(done)

    def replay_many(
        self,
        *,
        reason: str,
        actor: str | None = None,
        allow_cancelled: bool = False,
        with_dependents: bool = False,
        batch_size: int = 500,
        on_progress: Callable[[int], None] | None = None,
        connection: Connection[Any] | None = None,
        **filters: Unpack[JobFilter],
    ) -> ReplayResult:
        """Replay every dead job matching the filter (queue, task, error_code, older_than,
        newer_than), in batches, each its own short transaction; ``on_progress(n)`` after
        each batch. Returns how many were replayed (a :class:`ReplayResult`, an ``int``);
        jobs whose unique key another job holds are refused (audited, ``replay_refused``),
        listed in its ``refused``, and the replay goes on. ``with_dependents``: as in
        :meth:`replay`. With ``connection`` every batch runs in that connection's open
        transaction."""
        self._refuse_isolation(connection)
        statuses = ["dead", "cancelled"] if allow_cancelled else ["dead"]
        params = job_filter(statuses, **filters)
        batch = validate.check_int("batch_size", batch_size, 1, 10_000)
        total = 0
        refused: list[tuple[int, int | None, str]] = []
        while True:
            seen = len(refused)
            done = self._replay_batch(
                params, reason, actor, batch, refused, connection, with_dependents
            )
            if not done and len(refused) == seen:
                break
            total += done
            if on_progress is not None and done:
                on_progress(done)
        return ReplayResult(total, [(job_id, holder) for job_id, holder, _ in refused])

    def _replay_batch(
        self,
        params: dict[str, Any],
        reason: str,
        actor: str | None,
        limit: int,
        refused: list[tuple[int, int | None, str]],
        connection: Connection[Any] | None = None,
        with_dependents: bool = False,
    ) -> int:
        """One batch; appends (job id, holder, key) of each refusal to ``refused``, whose
        jobs the next batches then pass over."""
        if not isinstance(reason, str) or not reason.strip():
            raise ConfigError("replay needs a reason (what was fixed)")
        params = {
            **params,
            "limit": limit,
            "actor": actor,
            "reason": validate.bound_detail(reason),
            "channel": self.channel,
            "skip": [job_id for job_id, _, _ in refused],
        }
        with self._transaction(connection) as conn:
            candidates = self._rows("replay_candidates", params, conn)
            if not candidates:
                return 0
            keys = self._lock_keys(conn, [key for _, key in candidates])
            params["ids"] = [job_id for job_id, _ in candidates]
            rows = self._rows("replay_jobs", params, conn)
            self._promote_keys(conn, keys)
            replayed = [int(r[0]) for r in rows if not r[2]]
            back = []
            if with_dependents and replayed:
                back = self._rows("replay_dependents", {**params, "ids": replayed}, conn)
            # Replayed jobs with dependencies (and the dependents brought back) wait again.
            self._wait_again(conn, sorted(replayed + [int(r[0]) for r in back]))
        refused += [(int(r[0]), r[3], r[4]) for r in rows if r[2]]
        return sum(1 for r in rows if not r[2])

    def purge_dead(
        self,
        *,
        reason: str,
        actor: str | None = None,
        batch_size: int = 500,
        on_progress: Callable[[int], None] | None = None,
        job_id: int | None = None,
        **filters: Unpack[JobFilter],
    ) -> int:
        """Delete dead jobs matching the filter (``job_id``: that one job, if dead); each
        leaves a final ``purged`` event with ``actor`` and ``reason``. Returns how many
        were deleted."""
        if not isinstance(reason, str) or not reason.strip():
            raise ConfigError("purging dead jobs needs a reason")
        if job_id is not None:
            job_id = validate.check_int("job id", job_id, 1, 2**63 - 1)
        params = {
            **job_filter(["dead"], job_id=job_id, **filters),
            "skip": [],
            "limit": validate.check_int("batch_size", batch_size, 1, 10_000),
            "actor": actor,
            "reason": validate.bound_detail(reason),
        }
        total = 0
        while (done := self._purge_batch(params)) is not None:
            total += done
            if on_progress is not None and done:
                on_progress(done)
        return total

    def _purge_batch(self, params: dict[str, Any]) -> int | None:
        """One batch; None when no candidate is left. A dead member of a batch not yet done
        is kept (purge_jobs): it is passed over from then on (``skip``)."""
        with self._transaction() as conn:
            candidates = self._rows("replay_candidates", params, conn)
            if not candidates:
                return None
            keys = self._lock_keys(conn, [key for _, key in candidates])
            ids = [job_id for job_id, _ in candidates]
            rows = self._rows("purge_jobs", {**params, "ids": ids}, conn)
            purged = {int(row[0]) for row in rows}
            params["skip"] = [*params["skip"], *(i for i in ids if i not in purged)]
            # A purged dead head no longer holds its key: the next job of the key may run.
            self._promote_keys(conn, keys)
            return len(purged)

    def prune(
        self,
        *,
        older_than: float,
        batch_size: int = 1000,
        max_batches: int | None = None,
        pause: float = 0.0,
    ) -> int:
        """Retention: delete succeeded and cancelled jobs finished more than ``older_than``
        seconds ago (and their trail), in small batches that never make a claim wait on a
        lock; ``pause`` seconds between batches leaves WAL bandwidth to claims. Dead jobs
        are never pruned (see :meth:`purge_dead`). Returns how many were deleted."""
        params = {
            "older_than": validate.check_positive_seconds(
                "older_than", older_than, 100 * 365 * 86400.0
            ),
            "limit": validate.check_int("batch_size", batch_size, 1, 100_000),
        }
        total = batches = 0
        while max_batches is None or batches < max_batches:
            done = len(self._rows("prune_finished", params))
            total += done
            batches += 1
            if done < params["limit"]:
                break
            if pause > 0:
                time.sleep(pause)
        return total
