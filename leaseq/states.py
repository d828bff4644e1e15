"""The job state machine as pure rules: which transitions exist and what a failure leads to.

No I/O here. The SQL in ``queries.sql`` applies these decisions; tests check them without a
database.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class JobStatus(enum.StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    DEAD = "dead"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL


TERMINAL = frozenset({JobStatus.SUCCEEDED, JobStatus.DEAD, JobStatus.CANCELLED})

#: Every transition the queue may make, keyed by event. DESIGN.md section 2 in code form.
TRANSITIONS: dict[str, tuple[JobStatus, frozenset[JobStatus]]] = {
    "claim": (JobStatus.PENDING, frozenset({JobStatus.RUNNING})),
    "heartbeat": (JobStatus.RUNNING, frozenset({JobStatus.RUNNING})),
    "complete": (JobStatus.RUNNING, frozenset({JobStatus.SUCCEEDED})),
    "fail": (
        JobStatus.RUNNING,
        frozenset({JobStatus.PENDING, JobStatus.DEAD, JobStatus.CANCELLED}),
    ),
    "lease_expired": (JobStatus.RUNNING, frozenset({JobStatus.PENDING, JobStatus.DEAD})),
    "release": (JobStatus.RUNNING, frozenset({JobStatus.PENDING})),
    "cancel": (JobStatus.PENDING, frozenset({JobStatus.CANCELLED})),
    "cancel_requested": (JobStatus.RUNNING, frozenset({JobStatus.RUNNING})),
    "replay": (JobStatus.DEAD, frozenset({JobStatus.PENDING})),
}


def allowed(event: str, from_status: JobStatus, to_status: JobStatus) -> bool:
    """True when ``event`` may move a job from ``from_status`` to ``to_status``."""
    rule = TRANSITIONS.get(event)
    if rule is None:
        return False
    source, targets = rule
    if event == "replay":
        # Operators may also bring back a cancelled job when they ask for it explicitly.
        return from_status in (JobStatus.DEAD, JobStatus.CANCELLED) and to_status in targets
    return from_status == source and to_status in targets


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
