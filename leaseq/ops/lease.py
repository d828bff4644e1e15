# Generated from leaseq/ops/lease_async.py by tools/gen_sync.py. Do not edit by hand:
# change the async source and run `python tools/gen_sync.py`.
"""The lease protocol: claim, heartbeat, complete, and the fenced record of external
effects. Every write here presents the whole lease (id, owner, token, unexpired).

The synchronous twin of ``leaseq/ops/lease_async.py``; see that file for the logic.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

import psycopg
from psycopg import Connection

from leaseq import validate
from leaseq.errors import ConfigError
from leaseq.models import Heartbeat, Lease
from leaseq.ops.ending import EndingOps
from leaseq.ops.payloads import PayloadOps
from leaseq.owners import claim_owner
from leaseq.params import (
    CAREFUL_SECONDS,
    CLAIM_ATTEMPTS,
    FAIR_SECONDS,
    claim_goes_careful,
    coordinated,
    detail,
    fence_arrays,
    fence_groups,
    limited_only,
    results_channel,
    unclaimable_params,
)
from leaseq.rows import Unclaimable, leases_from_rows
from leaseq.states import JobStatus

log = logging.getLogger("leaseq.jobs")


class LeaseOps(EndingOps, PayloadOps):
    def claim(
        self,
        queue: str = "default",
        *,
        worker: str,
        lease_seconds: float = 60,
        limit: int = 1,
        connection: Connection[Any] | None = None,
    ) -> list[Lease]:
        """Claim up to ``limit`` claimable jobs of ``queue`` in one committed statement.

        The leases' owner is ``worker`` plus an identity of this claim of its own
        (``leaseq.owners``), so a claim that a failover lost and its re-issue never share
        a fence, even at the same token.

        With ``connection`` the claim joins that connection's transaction (the testing
        kit's ``drain`` runs jobs inside a test's own, never committed, transaction).

        A claimed row that cannot become a lease (see ``leaseq.rows``) is ended dead with
        its reason, under the lease just taken, and left out: it costs only its own job.
        """
        self._refuse_isolation(connection)
        seconds = validate.check_positive_seconds("lease_seconds", lease_seconds)
        want = validate.check_int("limit", limit, 1, validate.CLAIM_LIMIT_MAX)
        name = validate.check_name("queue", queue)
        params = {
            "queue": name,
            "owner": claim_owner(validate.check_worker_id(worker)),
            "lease_seconds": seconds,
            "limit": want,
        }
        # claim_jobs fails (nothing claimed) when limits apply that its fast path does not
        # handle, or when a slot number raced: then claim_limited_jobs, for a while. In a
        # caller's transaction a failed statement would end that transaction: always the
        # limited statement there (without limits it is the plain claim).
        careful = connection is not None or self._careful_until.get(name, 0.0) > time.monotonic()
        # A fair queue (docs/fairness.md): claim_jobs says so (LQ010, nothing claimed) and
        # claim_fair_jobs takes it, for a while; in a caller's transaction, asked first.
        now = time.monotonic()
        fair = self._fair_until.get(name, 0.0) > now
        if connection is not None and not fair:
            fair = bool((self._rows("queue_is_fair", params, connection))[0][0])
        rows: list[Any] = []
        for _ in range(CLAIM_ATTEMPTS):
            if fair:
                statement = "claim_fair_jobs"
            else:
                statement = "claim_limited_jobs" if careful else "claim_jobs"
            try:
                rows = self._rows(statement, params, connection)
                if fair and not rows:
                    # The keys in turn may all have been found empty (now parked): the
                    # next ones are asked once more before this claim says "nothing".
                    rows = self._rows(statement, params, connection)
                break
            except psycopg.Error as exc:
                if exc.sqlstate == "LQ010" and connection is None:
                    self._fair_until[name] = time.monotonic() + FAIR_SECONDS
                    fair = True
                    continue
                if exc.sqlstate == "LQ011" and connection is None:
                    # A job of cost above 1 under a queue limit whose slots are on the job
                    # rows (one number each): they move to slot rows, once per limit, in a
                    # transaction of their own (docs/limits.md, "Job cost"); claim again.
                    detail = exc.diag.message_detail or ""
                    self._rows("queue_limit_to_slot_rows", {"name": detail}, None)
                    careful = True
                    continue
                if exc.sqlstate == "LQ011":
                    # In a caller's transaction the move cannot be made (it waits for
                    # every claim in flight, that transaction's own included).
                    raise ConfigError(
                        f"a job of cost above 1 is under {exc.diag.message_detail}, whose "
                        "slots must first move to slot rows: claim once outside this "
                        "transaction (docs/limits.md, 'Job cost')"
                    ) from None
                if not claim_goes_careful(exc) or connection is not None:
                    raise
                # LQ001 (claim_needs_admit): limits apply; or a slot number under a queue
                # limit was taken by a claim that committed first, or two claims waited on
                # each other's numbers and the server ended one. Nothing was claimed.
                # After CLAIM_ATTEMPTS such races this claim returns nothing.
                self._careful_until[name] = time.monotonic() + CAREFUL_SECONDS
                careful = True
        leases, unclaimable = leases_from_rows(rows, seconds)
        leases = self._open_payloads(leases, unclaimable, connection)
        if unclaimable:
            self._end_unclaimable(unclaimable, connection)
        leases.sort(key=lambda lease: (-lease.priority, lease.job_id))
        return leases

    def _end_unclaimable(
        self, found: Sequence[Unclaimable], connection: Connection[Any] | None = None
    ) -> None:
        for row in found:
            log.warning(
                "job %d ended dead at claim (%s): %s",
                row.job_id,
                row.code,
                row.reason,
                extra={"job_id": row.job_id, "token": row.token, "error_code": str(row.code)},
            )
        try:
            # The keyed statement: a unique key of such a row must be let go too.
            with self._transaction(connection) as conn:
                rows = self._change_jobs(
                    "fail_keyed_jobs",
                    unclaimable_params(found),
                    [u.ordering_key for u in found],
                    conn,
                )
                self._promote_dependents(conn, [int(row[0]) for row in rows])
        except psycopg.Error as exc:
            # The good leases of this claim are committed and returned all the same; these
            # rows stay running until the sweeper expires them, and are caught again.
            log.warning("could not end %d unclaimable job(s) dead: %s", len(found), exc)

    def heartbeat_many(
        self, leases: Sequence[Lease], *, lease_seconds: float | None = None
    ) -> Heartbeat:
        """Renew several leases in one fenced statement; lost ones are reported, not renewed."""
        if not leases:
            return Heartbeat({}, frozenset(), frozenset())
        seconds = validate.check_positive_seconds(
            "lease_seconds",
            lease_seconds if lease_seconds is not None else max(x.lease_seconds for x in leases),
        )
        rows = []
        for fence in fence_groups(leases):
            rows += self._rows("heartbeat_jobs", {**fence, "lease_seconds": seconds})
        kept = {(int(row[0]), int(row[1])) for row in rows}
        return Heartbeat(
            renewed={int(row[0]): row[2] for row in rows},
            lost=frozenset((x.job_id, x.token) for x in leases) - kept,
            cancel_requested=frozenset(int(row[0]) for row in rows if row[3]),
        )

    def heartbeat(self, lease: Lease, *, lease_seconds: float | None = None) -> bool:
        """Extend the lease; False means it was lost and nothing changed."""
        result = self.heartbeat_many([lease], lease_seconds=lease_seconds)
        return (lease.job_id, lease.token) not in result.lost

    def complete_many(
        self,
        leases: Sequence[Lease],
        *,
        connection: Connection[Any] | None = None,
        results: Mapping[int, tuple[str, float]] | None = None,
    ) -> set[int]:
        """Mark jobs succeeded, fenced; returns the ids that were still ours. Leases of
        jobs with a unique key or with dependents take complete_keyed_jobs (which updates
        who holds the key and gives back limit slots, and then promotes dependents in the
        same transaction); leases claimed under limits and nothing else take
        complete_limited_jobs (one statement that gives back their slots); the others the
        plain statement. A plain lease the plain statement did not take may
        have gained dependents since its claim: it is tried with the coordinated one.

        ``results``: job id -> (JSON text, seconds to keep it) for tasks that store their
        result; stored in the same transaction, for the jobs this completion took only
        (see ``complete_leases`` to tell two leases of one job apart)."""
        given = results or {}
        by_lease = {(x.job_id, x.token): given[x.job_id] for x in leases if x.job_id in given}
        done = self.complete_leases(leases, connection=connection, results=by_lease)
        return {job_id for job_id, _ in done}

    def complete_leases(
        self,
        leases: Sequence[Lease],
        *,
        connection: Connection[Any] | None = None,
        results: Mapping[tuple[int, int], tuple[str, float]] | None = None,
    ) -> set[tuple[int, int]]:
        """``complete_many`` by lease: returns the (job id, token) of each lease that was
        still ours, and ``results`` are keyed the same way. A stale and a current lease of
        one job in one batch (a worker that lost a lease and claimed the job again) stay
        apart: only the current one's completion and result count."""
        self._refuse_isolation(connection)
        if not leases:
            return set()
        if not results:
            return self._complete(leases, connection)
        with self._transaction(connection) as conn:
            done = self._complete(leases, conn)
            stored = [x for x in leases if (x.job_id, x.token) in done]
            stored = [x for x in stored if (x.job_id, x.token) in results]
            if stored:
                params = {
                    "ids": [x.job_id for x in stored],
                    "tokens": [x.token for x in stored],
                    "values": [
                        self._seal_value(x.task, results[x.job_id, x.token][0], "result")
                        for x in stored
                    ],
                    "ttls": [results[x.job_id, x.token][1] for x in stored],
                    "channel": results_channel(self.schema),
                }
                self._rows("store_results", params, conn)
        return done

    def _complete(
        self, leases: Sequence[Lease], connection: Connection[Any] | None
    ) -> set[tuple[int, int]]:
        """The completion statements; returns (job id, token) of the leases they took."""
        plain = [x for x in leases if not coordinated(x)]
        done: set[tuple[int, int]] = set()
        if plain:
            keys = [lease.ordering_key for lease in plain]
            rows = self._change_jobs("complete_jobs", fence_groups(plain), keys, connection)
            done = {(int(row[0]), int(row[2])) for row in rows}
            if len(done) == len(leases):
                return done
        # Leases claimed under limits and nothing else: one statement frees their slots.
        limited = [x for x in leases if limited_only(x)]
        if limited:
            keys = [lease.ordering_key for lease in limited]
            rows = self._change_jobs(
                "complete_limited_jobs", fence_groups(limited), keys, connection
            )
            done |= {(int(row[0]), int(row[2])) for row in rows}
            if len(done) == len(leases):
                return done
        rest = [x for x in leases if (x.job_id, x.token) not in done]
        with self._transaction(connection) as conn:
            keys = [lease.ordering_key for lease in rest]
            rows = self._change_jobs("complete_keyed_jobs", fence_groups(rest), keys, conn)
            ended = {(int(row[0]), int(row[2])) for row in rows}
            self._promote_dependents(conn, {job_id for job_id, _ in ended})
        return done | ended

    def complete(self, lease: Lease, *, connection: Connection[Any] | None = None) -> bool:
        """Mark the job succeeded; False means the lease was lost and nothing changed.

        With ``connection`` the completion joins that connection's transaction, so the
        handler's own writes there commit together with it, or not at all.
        """
        return lease.job_id in self.complete_many([lease], connection=connection)

    def attempts_ended(self, leases: Sequence[Lease]) -> dict[int, JobStatus]:
        """The jobs whose attempt under these leases was ended by the lease's own write
        (completion or failure), with their status now: the re-read after a fenced write
        whose commit may or may not have happened (never assume either). A job the sweep
        ended, or that was claimed again, is left out."""
        if not leases:
            return {}
        rows = self._rows("attempts_ended", fence_arrays(leases))
        return {int(row[0]): JobStatus(row[1]) for row in rows if row[2]}

    def effect_start(self, lease: Lease, name: str, key: str) -> bool:
        """Record an effect as started, fenced by the lease; False means the lease is lost."""
        params = {
            "id": lease.job_id,
            "owner": lease.owner,
            "token": lease.token,
            "attempt": lease.attempt,
            "name": name,
            "key": key,
        }
        return bool(self._rows("effect_start", params))

    def effect_finish(
        self,
        lease: Lease,
        name: str,
        key: str,
        *,
        status: str,
        result: Any = None,
        error: str | None = None,
    ) -> bool:
        """Record an effect's outcome (``done`` with a JSON result, or ``failed``)."""
        params = {
            "id": lease.job_id,
            "token": lease.token,
            "name": name,
            "key": key,
            "status": status,
            "result": self._seal_value(
                lease.task, validate.encode_payload(result, self.payload_limit), "effect"
            ),
            "error": detail(self.redact, error),
        }
        return bool(self._rows("effect_finish", params))
