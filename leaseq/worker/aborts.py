"""Why a handler must stop: the exceptions a handler sees once the worker gave up on it.

Both ``context`` (``ctx.progress()``, ``ctx.complete_in()``) and ``effects`` (effect records,
fenced transactions) raise these; they live here so that neither module imports the other
for them.
"""

from __future__ import annotations

from leaseq.codes import ErrorCode
from leaseq.errors import LeaseqError
from leaseq.models import Lease


class JobAborted(LeaseqError):
    """Raised by :meth:`JobContext.progress` once the worker gave up on this attempt
    (``reason``: ``NO_PROGRESS``, ``MAX_RUNTIME_EXCEEDED``, ``CANCELLED``, ``WORKER_SHUTDOWN``
    or ``LEASE_LOST``). The worker has already recorded the outcome; just stop."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class LeaseLost(JobAborted):
    """The lease is gone (expired, or taken by another worker): stop, report nothing."""


def aborted(lease: Lease, reason: str) -> JobAborted:
    """The exception for an attempt given up for ``reason``."""
    message = f"job {lease.job_id} (token {lease.token}) aborted: {reason}"
    if reason == ErrorCode.LEASE_LOST:
        return LeaseLost(reason, message)
    return JobAborted(reason, message)


def lease_lost(lease: Lease, what: str = "lease lost") -> LeaseLost:
    return LeaseLost(ErrorCode.LEASE_LOST, f"job {lease.job_id} (token {lease.token}): {what}")


class JobSuspended(JobAborted):
    """Raised by ``ctx.sleep`` / ``ctx.wait_for`` once the job is suspended: the lease is
    given back and the handler runs again when the job wakes. Let it propagate (a handler
    that swallows it changes nothing: the job is suspended, and the worker reports
    nothing for this run)."""
