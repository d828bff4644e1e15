"""The job state machine as pure rules: which transitions exist and what a failure leads to.

No I/O here. The SQL in ``leaseq/sql/queries/`` applies these decisions; tests check them without a
database.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import NamedTuple


class JobStatus(enum.StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    DEAD = "dead"
    CANCELLED = "cancelled"
    #: Sleeping or waiting for a signal (ctx.sleep, ctx.wait_for): no lease, no slot.
    SUSPENDED = "suspended"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL


TERMINAL = frozenset({JobStatus.SUCCEEDED, JobStatus.DEAD, JobStatus.CANCELLED})


class Transition(NamedTuple):
    """One move of the state machine, as a ``job_events`` row records it: ``event`` is the
    stored event name. ``None`` as ``from_status`` means the job did not exist yet; as
    ``to_status``, that the row is gone (the trail keeps the event)."""

    from_status: JobStatus | None
    event: str
    to_status: JobStatus | None


_P, _R, _S = JobStatus.PENDING, JobStatus.RUNNING, JobStatus.SUCCEEDED
_D, _C = JobStatus.DEAD, JobStatus.CANCELLED
_Z = JobStatus.SUSPENDED

#: Every transition the queue may make, named as the trail names it. The SQL in
#: ``leaseq/sql/queries/`` writes the events; the stateful test checks every stored event against
#: this table, and a unit test checks that every event name the SQL writes is in it.
TRANSITIONS: frozenset[Transition] = frozenset(
    Transition(*t)
    for t in (
        (None, "enqueued", _P),
        (_P, "claimed", _R),
        (_R, "heartbeat", _R),
        (_R, "succeeded", _S),
        # A failed attempt (fail_jobs): retried, dead, or cancelled if a cancel was requested.
        (_R, "retry_scheduled", _P),
        (_R, "dead", _D),
        (_R, "cancelled", _C),
        # The sweeper found the lease expired: the same three outcomes as a failure.
        (_R, "lease_expired", _P),
        (_R, "lease_expired", _D),
        (_R, "lease_expired", _C),
        # Shutdown gives back a lease whose handler never started; a superseded one (its
        # unique key moved to a follow-up) ends cancelled instead of living on beside it.
        (_R, "released", _P),
        (_R, "released", _C),
        # An operator cancels: a pending job at once, a running one at its next heartbeat.
        (_P, "cancelled", _C),
        # A pending job past its start deadline (expires=) ends unrun (the sweep).
        (_P, "expired", _C),
        # An operator makes a scheduled pending job (a retry's back-off) due now.
        (_P, "run_now", _P),
        (_R, "cancel_requested", _R),
        # Operator actions on dead (or, when asked, cancelled) jobs.
        (_D, "replayed", _P),
        (_C, "replayed", _P),
        (_D, "key_skipped", _D),
        (_D, "purged", None),
        # Unique keys: a replay refused because another job holds the key (nothing moves);
        # a pending holder's payload replaced by an enqueue of its key; a holder whose key
        # moved to a follow-up job (it keeps running; a failed attempt then ends it).
        (_D, "replay_refused", _D),
        (_C, "replay_refused", _C),
        (_P, "unique_replaced", _P),
        (_R, "superseded", _R),
        (_P, "superseded", _P),
        # Dependencies: a waiting job whose dependencies all ended becomes claimable; one
        # whose dependency ended dead or cancelled under the "cancel" policy ends cancelled.
        (_P, "promoted", _P),
        (_P, "dependency_failed", _C),
        # Durable sleep and signals: a running job gives its lease back to wait (not a
        # failure: the attempt is not charged); the claim wakes it when due, a signal it
        # waits for wakes it at once; an operator cancels it at once, like a pending job.
        (_R, "suspended", _Z),
        (_Z, "woken", _P),
        (_Z, "signalled", _P),
        (_Z, "cancelled", _C),
        (_Z, "superseded", _Z),
    )
)

#: Transitions that write no ``job_events`` row: the job row itself shows them (status,
#: token, attempt, timestamps), and recording every claim would double the write load.
UNRECORDED_EVENTS = frozenset({"enqueued", "claimed", "heartbeat", "succeeded"})

#: Every event name in the table.
EVENTS = frozenset(t.event for t in TRANSITIONS)


def _status(value: JobStatus | str | None) -> JobStatus | None:
    return None if value is None else JobStatus(value)


def allowed(
    event: str, from_status: JobStatus | str | None, to_status: JobStatus | str | None
) -> bool:
    """True when ``event`` may move a job from ``from_status`` to ``to_status``. Statuses
    may be given as stored text; an unknown status or event is not allowed."""
    try:
        move = Transition(_status(from_status), event, _status(to_status))
    except ValueError:
        return False
    return move in TRANSITIONS


@dataclass(frozen=True)
class FailureDecision:
    """What a failed (or expired) attempt leads to: a retry after ``delay`` s, or dead.

    ``reason`` says why, in words an operator reads in the audit trail.
    """

    to_status: JobStatus
    delay: float
    reason: str

    @property
    def retry(self) -> bool:
        return self.to_status is JobStatus.PENDING


def decide_failure(
    *,
    attempt: int,
    max_attempts: int,
    error_class: str = "transient",
    delay: float,
    unknown_failures: int = 0,
    unknown_attempts: int = 3,
    elapsed: float | None = None,
    max_elapsed: float | None = None,
) -> FailureDecision:
    """Retry while the failure may improve and every budget allows it; otherwise dead.

    ``attempt`` is the attempt that just failed (1-based, as counted at claim time);
    ``unknown_failures`` counts the job's earlier failures of class unknown; ``elapsed`` is
    seconds since the job was enqueued; ``delay`` the back-off the policy chose.
    """
    if error_class == "permanent":
        return FailureDecision(JobStatus.DEAD, 0.0, "permanent failure")
    if attempt >= max_attempts:
        return FailureDecision(JobStatus.DEAD, 0.0, f"all {max_attempts} attempts used")
    if error_class == "unknown" and unknown_failures + 1 >= unknown_attempts:
        return FailureDecision(
            JobStatus.DEAD, 0.0, f"{unknown_failures + 1} failures of unknown cause"
        )
    delay = max(0.0, delay)
    if max_elapsed is not None and elapsed is not None and elapsed + delay > max_elapsed:
        return FailureDecision(
            JobStatus.DEAD, 0.0, f"retry would start after the {max_elapsed:g}s time budget"
        )
    return FailureDecision(JobStatus.PENDING, delay, f"retry in {delay:.3g}s")
