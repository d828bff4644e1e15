# Generated from leaseq/ops/failure_async.py by tools/gen_sync.py. Do not edit by hand:
# change the async source and run `python tools/gen_sync.py`.
"""Failures: a worker's fenced report of a failed attempt, giving back unstarted jobs, and
the sweep of expired leases. What a failure leads to is decided once, in
``leaseq.params.decide``, for reported failures and expired leases alike.

The synchronous twin of ``leaseq/ops/failure_async.py``; see that file for the logic.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from psycopg import Connection

from leaseq import validate
from leaseq.models import Failure, Lease, SweepResult
from leaseq.ops.ending import EndingOps
from leaseq.params import coordinated, expire_params, fail_params, fence_arrays, limited_only
from leaseq.retry import ErrorClass, RetryPolicy
from leaseq.states import JobStatus


class FailureOps(EndingOps):
    def fail_many(
        self, failures: Sequence[Failure], *, connection: Connection[Any] | None = None
    ) -> dict[int, JobStatus]:
        """Report failed attempts, fenced; returns each job still ours with its new status.
        With ``connection`` the report joins that connection's transaction."""
        ended = self.fail_leases(failures, connection=connection)
        return {job_id: status for (job_id, _), status in ended.items()}

    def fail_leases(
        self, failures: Sequence[Failure], *, connection: Connection[Any] | None = None
    ) -> dict[tuple[int, int], JobStatus]:
        """``fail_many`` by lease: the (job id, token) of each failure still ours, with the
        job's new status, so a stale and a current lease of one job stay apart."""
        self._refuse_isolation(connection)
        if not failures:
            return {}
        result: dict[tuple[int, int], JobStatus] = {}
        # Leases claimed under limits and nothing else take fail_limited_jobs (the plain
        # failure that also gives back their slots). Jobs with a unique key or dependents
        # (and leases of limits the one-statement paths did not take) take
        # fail_keyed_jobs (superseded jobs are not retried, an ending job updates who holds
        # its key and gives back its limit slots, its dependents are decided in the same
        # transaction); the others the plain statement, which leaves out jobs that
        # gained dependents since their claim: those are tried with the coordinated one.
        plain = [f for f in failures if not coordinated(f.lease)]
        if plain:
            params = fail_params(plain, self.retry_policy, self.redact)
            keys = [f.lease.ordering_key for f in plain]
            rows = self._change_jobs("fail_jobs", params, keys, connection)
            result.update({(int(r[0]), int(r[2])): JobStatus(r[1]) for r in rows})
        # Leases claimed under limits and nothing else: one statement frees their slots.
        limited = [f for f in failures if limited_only(f.lease)]
        if limited:
            params = fail_params(limited, self.retry_policy, self.redact)
            keys = [f.lease.ordering_key for f in limited]
            rows = self._change_jobs("fail_limited_jobs", params, keys, connection)
            result.update({(int(r[0]), int(r[2])): JobStatus(r[1]) for r in rows})
        rest = [f for f in failures if (f.lease.job_id, f.lease.token) not in result]
        if rest:
            params = fail_params(rest, self.retry_policy, self.redact)
            keys = [f.lease.ordering_key for f in rest]
            with self._transaction(connection) as conn:
                rows = self._change_jobs("fail_keyed_jobs", params, keys, conn)
                ended = {(int(r[0]), int(r[2])): JobStatus(r[1]) for r in rows}
                self._promote_dependents(
                    conn, [job_id for (job_id, _), s in ended.items() if s.terminal]
                )
            result.update(ended)
        return result

    def fail(
        self,
        lease: Lease,
        error_code: str,
        *,
        retryable: bool = True,
        detail: str | None = None,
        retry_in: float | None = None,
        error_class: str | None = None,
        connection: Connection[Any] | None = None,
    ) -> bool:
        """Record a failed attempt: retry later with back-off, or dead when it cannot help
        (not retryable, or a budget is used up). ``error_class`` (permanent, transient,
        unknown) overrides ``retryable``. False means the lease was lost."""
        if error_class is not None:
            ErrorClass(error_class)  # refuse a typo before anything is written
        failure = Failure(lease, error_code, retryable, detail, retry_in, error_class)
        return lease.job_id in self.fail_many([failure], connection=connection)

    def release_many(self, leases: Sequence[Lease]) -> set[int]:
        """Give unstarted jobs back without charging an attempt; returns the ids released.
        A job whose unique key moved to a follow-up meanwhile ends cancelled (SUPERSEDED)
        rather than coming back beside the follow-up."""
        if not leases:
            return set()
        # A released head goes back in line by id: an earlier job replayed meanwhile goes first.
        keys = [lease.ordering_key for lease in leases]
        with self._transaction() as conn:
            rows = self._change_jobs("release_jobs", fence_arrays(leases), keys, conn)
            # A superseded job ends cancelled instead (its key moved to a follow-up): its
            # dependents and batch are decided in this transaction, as for any ending.
            self._promote_dependents(conn, [int(r[0]) for r in rows if r[1] != "pending"])
        return {int(row[0]) for row in rows}

    def release(self, lease: Lease) -> bool:
        """Give an unstarted job back; False means the lease was lost and nothing changed."""
        return lease.job_id in self.release_many([lease])

    def sweep(
        self,
        *,
        batch_size: int = 1000,
        actor: str = "sweeper",
        policies: Mapping[str, RetryPolicy] | None = None,
    ) -> SweepResult:
        """Recover expired leases: retry with back-off, or dead once a budget is used up.

        ``policies`` maps task names to their own retry policies (the client's otherwise).
        Works in batches, each its own short transaction; several sweepers may run at once.
        """
        batch = validate.check_int("batch_size", batch_size, 1, 100_000)
        total = SweepResult()
        # Upkeep: one bounded batch of ended unique-key windows per sweep.
        self._rows("delete_expired_windows", {"limit": batch})
        # And a safety net for limit slots whose lease is no longer running.
        self._rows("delete_orphan_slots", {})
        # And of stored results past their result_ttl (independent of job pruning).
        self._rows("delete_expired_results", {"limit": batch})
        total = SweepResult(expired=self._expire_pending(batch, actor))
        while True:
            with self._pooled() as conn, conn.transaction():
                locked = self._rows("lock_expired_leases", {"limit": batch}, conn)
                if not locked:
                    return total
                full_batch = len(locked) == batch
                wanted = sorted({row[7] for row in locked if row[7]})
                keys: list[str] = []
                if wanted:
                    got = self._rows("try_lock_keys", {"keys": wanted}, conn)
                    keys = [key for key, ok in got if ok]
                    # A key busy elsewhere: leave its jobs for the next sweep.
                    locked = [row for row in locked if not row[7] or row[7] in keys]
                params = expire_params(locked, self.retry_policy, policies, actor)
                done = self._rows("expire_leases", params, conn)
                self._promote_keys(conn, keys)
                # Dependents of jobs that ended here are decided in this transaction.
                self._promote_dependents(conn, [int(row[0]) for row in done if row[1] != "pending"])
            total = total + SweepResult(
                requeued=sum(1 for row in done if row[1] == "pending"),
                dead=sum(1 for row in done if row[1] == "dead"),
                cancelled=sum(1 for row in done if row[1] == "cancelled"),
            )
            if not full_batch:
                return total

    def _expire_pending(self, batch: int, actor: str) -> int:
        """End pending jobs past their start deadline (cancelled, EXPIRED), in batches,
        each its own short transaction: their ordering keys' heads and their dependents
        are decided in the same one. Returns how many ended."""
        expired = 0
        while True:
            with self._pooled() as conn, conn.transaction():
                locked = self._rows("lock_expiring_jobs", {"limit": batch}, conn)
                if not locked:
                    return expired
                wanted = sorted({row[1] for row in locked if row[1]})
                keys: list[str] = []
                if wanted:
                    got = self._rows("try_lock_keys", {"keys": wanted}, conn)
                    keys = [key for key, ok in got if ok]
                ids = [int(row[0]) for row in locked if not row[1] or row[1] in keys]
                params = {"ids": ids, "actor": actor}
                done = [int(row[0]) for row in self._rows("expire_pending_jobs", params, conn)]
                self._promote_keys(conn, keys)
                self._promote_dependents(conn, done)
            expired += len(done)
            if len(locked) < batch or not done:
                return expired
