"""What a handler gets besides its payload: who it is running as, and the lease's health."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from leaseq.errors import LeaseqError
from leaseq.models import Lease


class LeaseLost(LeaseqError):
    """Raised by :meth:`JobContext.progress` once the lease is gone: stop, report nothing."""


@dataclass
class JobContext:
    """Per-attempt context passed to every handler as its first argument.

    ``idempotency_key`` is stable across every attempt of the job: send it to external
    systems (e.g. as an ``Idempotency-Key`` header) so a retried attempt cannot act twice.
    ``fencing_token`` grows with every claim; a system that remembers the highest token it
    has seen can refuse a stale worker's late write.
    """

    lease: Lease
    worker_id: str
    _lost: threading.Event = field(default_factory=threading.Event, repr=False)
    _cancel: threading.Event = field(default_factory=threading.Event, repr=False)
    _last_progress: float = field(default_factory=time.monotonic, repr=False)
    progress_note: Any = None

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
        """True once a renewal found the lease gone; the result will not be reported."""
        return self._lost.is_set()

    @property
    def cancel_requested(self) -> bool:
        """True once an operator asked to cancel this running job."""
        return self._cancel.is_set()

    def progress(self, note: Any = None) -> None:
        """Say the handler is making progress. Raises :class:`LeaseLost` if the lease is gone,
        so a sync handler stops at its next checkpoint instead of working for nothing."""
        if self._lost.is_set():
            raise LeaseLost(f"lease on job {self.job_id} (token {self.fencing_token}) was lost")
        self._last_progress = time.monotonic()
        self.progress_note = note

    @property
    def last_progress(self) -> float:
        return self._last_progress

    def mark_lost(self) -> None:
        self._lost.set()

    def mark_cancel_requested(self) -> None:
        self._cancel.set()
