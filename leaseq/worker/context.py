"""What a handler gets besides its payload: who it is running as, and the lease's health."""

from __future__ import annotations

import time
from typing import Any

from leaseq.errors import LeaseqError
from leaseq.models import Lease

LEASE_LOST = "LEASE_LOST"


class JobAborted(LeaseqError):
    """Raised by :meth:`JobContext.progress` once the worker gave up on this attempt
    (``reason``: ``NO_PROGRESS``, ``MAX_RUNTIME_EXCEEDED``, ``CANCELLED``, ``WORKER_SHUTDOWN``
    or ``LEASE_LOST``). The worker has already recorded the outcome; just stop."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class LeaseLost(JobAborted):
    """The lease is gone (expired, or taken by another worker): stop, report nothing."""


class JobContext:
    """Per-attempt context passed to every handler as its first argument.

    ``idempotency_key`` is stable across every attempt of the job: send it to external
    systems (e.g. as an ``Idempotency-Key`` header) so a retried attempt cannot act twice.
    ``fencing_token`` grows with every claim; a system that remembers the highest token it
    has seen can refuse a stale worker's late write.

    Thread-safe: a sync handler calls :meth:`progress` from its thread while the worker's
    event loop reads and aborts.
    """

    __slots__ = ("_abort", "_last_progress", "lease", "progress_note", "worker_id")

    def __init__(self, lease: Lease, worker_id: str) -> None:
        self.lease = lease
        self.worker_id = worker_id
        self.progress_note: Any = None
        self._last_progress = time.monotonic()
        # Written once by the event loop, read by the handler's thread: a plain attribute
        # is enough (one reference assignment), and costs nothing per job.
        self._abort: str | None = None

    def __repr__(self) -> str:
        return f"<JobContext job={self.job_id} token={self.fencing_token} attempt={self.attempt}>"

    @property
    def job_id(self) -> int:
        return self.lease.job_id

    @property
    def attempt(self) -> int:
        return self.lease.attempt

    @property
    def fencing_token(self) -> int:
        return self.lease.token

    @property
    def idempotency_key(self) -> str:
        return f"leaseq-job-{self.lease.job_id}"

    @property
    def task(self) -> str:
        return self.lease.task

    @property
    def queue(self) -> str:
        return self.lease.queue

    @property
    def lease_lost(self) -> bool:
        """True once the lease is known to be gone; the result will not be reported."""
        return self._abort == LEASE_LOST

    @property
    def aborted(self) -> str | None:
        """Why the worker gave up on this attempt (see :class:`JobAborted`), or None."""
        return self._abort

    @property
    def cancel_requested(self) -> bool:
        return self._abort == "CANCELLED"

    def progress(self, note: Any = None) -> None:
        """Report progress. Under the default renewal policy the lease is renewed only while
        the handler reports progress at least once per lease length.

        Raises :class:`LeaseLost` (or :class:`JobAborted`) once the worker gave up on this
        attempt, so a sync handler stops at its next checkpoint instead of working for
        nothing.
        """
        reason = self._abort
        if reason is not None:
            message = f"job {self.job_id} (token {self.fencing_token}) aborted: {reason}"
            raise (
                LeaseLost(reason, message) if reason == LEASE_LOST else JobAborted(reason, message)
            )
        self._last_progress = time.monotonic()
        self.progress_note = note

    @property
    def last_progress(self) -> float:
        """``time.monotonic()`` of the last progress report (or of the start)."""
        return self._last_progress

    def abort(self, reason: str) -> bool:
        """Mark the attempt abandoned; False if it already was (the first reason wins)."""
        if self._abort is not None:
            return False
        self._abort = reason
        return True

    def mark_started(self) -> None:
        self._last_progress = time.monotonic()
