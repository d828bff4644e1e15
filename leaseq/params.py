"""Parameters of the client's statements: pure code, shared by the async and sync clients.

Everything here turns Python values into what a named statement of ``leaseq/sql/queries/``
takes (fence arrays, the operator filter, the channels) or decides what a failed attempt
leads to; a job's own options are ``leaseq.jobspec``'s. No I/O: the client modules, which
are generated async → sync, only call it.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Unpack

import psycopg

from leaseq import validate
from leaseq.errors import ConfigError
from leaseq.models import Failure, JobFilter, Lease
from leaseq.redact import Redactor
from leaseq.retry import ErrorClass, RetryPolicy
from leaseq.rows import Unclaimable
from leaseq.states import FailureDecision, JobStatus, decide_failure


def notify_channel(schema: str) -> str:
    """The LISTEN/NOTIFY channel of a schema; the payload of each notification is a queue."""
    return f"leaseq.{schema}"


def results_channel(schema: str) -> str:
    """The channel of stored results; the payload of each notification is a job id."""
    return f"leaseq.r.{schema}"


# -- enqueue ---------------------------------------------------------------------------


def default_idempotency_key(job_id: int, created_at: dt.datetime) -> str:
    """The ``ctx.idempotency_key`` of a job enqueued without one, as claim_jobs builds it:
    ``leaseq-job-<id>-<created_at, UTC, YYYYMMDDHHMMSSffffff>``. The id alone is not
    enough: after a failover that lost an enqueue, the new primary hands the same id to
    another job. created_at is stored with the job, so the key is the same at every
    attempt (and replay)."""
    return f"leaseq-job-{job_id}-{created_at.astimezone(dt.UTC):%Y%m%d%H%M%S%f}"


# -- fences ----------------------------------------------------------------------------


def coordinated(lease: Lease) -> bool:
    """Does ending this lease take the coordinated statements (complete_keyed_jobs,
    fail_keyed_jobs)? Yes for a unique key (who holds it changes), for a lease that may hold
    slot rows (claimed while task or key limits existed: they are deleted in the same
    statement; a queue limit's slot is on the job row, which every ending statement
    clears), and for a job others depend on (its end promotes them in the same
    transaction)."""
    return lease.unique_key is not None or lease.slot_rows or lease.has_dependents


def limited_only(lease: Lease) -> bool:
    """Is this a lease that may hold slot rows and nothing else coordinated (no unique key,
    no dependents)? Its completion is complete_limited_jobs: one statement that frees its
    slots, with no transaction around it."""
    return lease.slot_rows and lease.unique_key is None and not lease.has_dependents


def fence_arrays(leases: Sequence[Lease]) -> dict[str, list[Any]]:
    return {
        "ids": [lease.job_id for lease in leases],
        "owners": [lease.owner for lease in leases],
        "tokens": [lease.token for lease in leases],
    }


def bigint_array(values: Iterable[int]) -> str:
    """An int8[] literal. psycopg dumps a list at about 0.8 us an element (it picks the
    smallest integer type that fits, element by element); a literal costs a tenth of that,
    and the fenced batch statements send two arrays per batch of jobs."""
    return "{" + ",".join(str(int(v)) for v in values) + "}"


def text_array(values: Iterable[str]) -> str:
    """A text[] literal (every element quoted), for the same reason as :func:`bigint_array`."""
    return "{" + ",".join(_quoted(v) for v in values) + "}"


def _quoted(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def fence_groups(leases: Sequence[Lease]) -> list[dict[str, Any]]:
    """Parameters of the ``_owned_by_token`` fence: ids ascending and unique, as its binary
    search needs, with each id's owner and token at the same place. Owners differ from
    claim to claim (``leaseq.owners``), so a batch is one group whatever claims it mixes; a
    job held twice in a batch (a stale lease and the current one) goes into a second
    group, so neither hides the other."""
    groups: list[dict[int, Lease]] = []
    for lease in leases:
        for group in groups:
            if lease.job_id not in group:
                group[lease.job_id] = lease
                break
        else:
            groups.append({lease.job_id: lease})
    fences = []
    for group in groups:
        ids = sorted(group)
        fences.append(
            {
                "ids": bigint_array(ids),
                "owners": text_array(group[i].owner for i in ids),
                "tokens": bigint_array(group[i].token for i in ids),
            }
        )
    return fences


# -- failures --------------------------------------------------------------------------


def detail(redact: Redactor | None, text: str | None) -> str | None:
    """An error detail as stored: scrubbed of secrets (unless ``redact`` is None), bounded."""
    if text is not None and redact is not None:
        text = redact(text)
    return validate.bound_detail(text)


def decide(
    policy: RetryPolicy,
    *,
    attempt: int,
    max_attempts: int,
    error_class: ErrorClass,
    unknown_failures: int,
    elapsed: float | None,
    retry_in: float | None = None,
) -> FailureDecision:
    """The one decision of what a failed or expired attempt leads to, under ``policy``."""
    return decide_failure(
        attempt=attempt,
        max_attempts=max_attempts,
        error_class=error_class,
        delay=policy.delay(attempt, retry_in),
        unknown_failures=unknown_failures,
        unknown_attempts=policy.unknown_attempts,
        elapsed=elapsed,
        max_elapsed=policy.max_elapsed,
    )


def decide_reported(failure: Failure, default: RetryPolicy) -> FailureDecision:
    """:func:`decide` for a failure a worker reports; the job's age is counted from its
    creation to the claim (database clock) plus the time held since (local clock)."""
    lease = failure.lease
    elapsed = None
    if lease.claimed_at is not None and lease.created_at is not None:
        waited = (lease.claimed_at - lease.created_at).total_seconds()
        elapsed = waited + (time.monotonic() - lease.claimed_monotonic)
    return decide(
        failure.policy or default,
        attempt=lease.attempt,
        max_attempts=lease.max_attempts,
        error_class=failure.effective_class,
        unknown_failures=lease.unknown_failures,
        elapsed=elapsed,
        retry_in=failure.retry_in,
    )


def fail_params(
    failures: Sequence[Failure], default: RetryPolicy, redact: Redactor | None
) -> dict[str, Any]:
    """The parameters of fail_jobs: each failure with its decided next state."""
    decisions = [decide_reported(f, default) for f in failures]
    return {
        **fence_arrays([f.lease for f in failures]),
        "to_statuses": [str(d.to_status) for d in decisions],
        "delays": [d.delay for d in decisions],
        "reasons": [d.reason for d in decisions],
        "codes": [validate.bound_code(f.error_code) for f in failures],
        "classes": [str(f.effective_class) for f in failures],
        "details": [detail(redact, f.detail) for f in failures],
    }


def expire_params(
    locked: Sequence[Sequence[Any]],
    default: RetryPolicy,
    policies: Mapping[str, RetryPolicy] | None,
    actor: str,
) -> dict[str, Any]:
    """The parameters of expire_leases for rows of lock_expired_leases: an expired lease
    is a transient failure, decided as any reported one is."""
    decisions = [
        decide(
            (policies or {}).get(task) or default,
            attempt=attempt,
            max_attempts=max_attempts,
            error_class=ErrorClass.TRANSIENT,
            unknown_failures=unknown,
            elapsed=elapsed,
        )
        for _, _, task, attempt, max_attempts, unknown, elapsed, _ in locked
    ]
    return {
        "ids": [row[0] for row in locked],
        "tokens": [row[1] for row in locked],
        "to_statuses": [str(d.to_status) for d in decisions],
        "delays": [d.delay for d in decisions],
        "reasons": [d.reason for d in decisions],
        "actor": actor,
    }


# -- the operator filter -----------------------------------------------------------------


def job_filter(
    statuses: Sequence[str], *, job_id: int | None = None, **filters: Unpack[JobFilter]
) -> dict[str, Any]:
    """Parameters of the operator filter shared by listing, replay and purge."""
    unknown = set(filters) - set(JobFilter.__annotations__)
    if unknown:
        raise ConfigError(f"unknown job filter: {', '.join(sorted(unknown))}")
    return {
        "statuses": [str(JobStatus(s)) for s in statuses],
        "id": job_id,
        **{name: filters.get(name) for name in JobFilter.__annotations__},
    }


def unclaimable_params(found: Sequence[Unclaimable]) -> dict[str, Any]:
    """The parameters of fail_jobs that end claimed-but-unreadable rows dead, each fenced by
    the lease the claim just took (see ``leaseq.rows``)."""
    return {
        "ids": [u.job_id for u in found],
        "owners": [u.owner for u in found],
        "tokens": [u.token for u in found],
        "to_statuses": [str(JobStatus.DEAD)] * len(found),
        "delays": [0.0] * len(found),
        "reasons": ["cannot be claimed"] * len(found),
        "codes": [str(u.code) for u in found],
        "classes": [str(ErrorClass.PERMANENT)] * len(found),
        "details": [validate.bound_detail(u.reason) for u in found],
    }


#: How long a queue's claims take claim_limited_jobs after claim_jobs could not (limits it
#: does not handle, or a slot number still held; see the client's claim): long enough that
#: such a queue costs one failed statement per this many seconds, short enough that a limit
#: far from full soon gets the fast path again.
CAREFUL_SECONDS = 10.0
#: Statements one claim may try when slot numbers race (see claim).
CLAIM_ATTEMPTS = 3
#: How long a client claims a queue that claim_jobs said is fair (LQ010) with
#: claim_fair_jobs before it asks again: one refused statement per this many seconds.
FAIR_SECONDS = 30.0


def claim_goes_careful(exc: psycopg.Error) -> bool:
    """Did claim_jobs fail in a way claim_limited_jobs handles (nothing was claimed)?"""
    return exc.sqlstate == "LQ001" or isinstance(
        exc, (psycopg.errors.UniqueViolation, psycopg.errors.DeadlockDetected)
    )
