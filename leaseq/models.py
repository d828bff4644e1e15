"""Plain data that crosses the public API: leases, jobs, events, counts."""

from __future__ import annotations

import datetime as dt
import enum
import time
from dataclasses import dataclass, field
from typing import Any, TypedDict

from leaseq.retry import ErrorClass, RetryPolicy
from leaseq.states import JobStatus


class Printable:
    """``as_dict()`` for JSON output: datetimes as ISO 8601, enums as their values."""

    def as_dict(self) -> dict[str, Any]:
        return {
            k: v.isoformat()
            if isinstance(v, dt.datetime)
            else v.value
            if isinstance(v, enum.Enum)
            else v
            for k, v in self.__dict__.items()
        }


@dataclass(frozen=True)
class Lease:
    """Proof of ownership of one claimed job; every later write must present it whole.

    ``token`` is the fencing token: it grows by one on every claim of the job, so a worker
    holding an older lease can never change the job once someone else claimed it.
    """

    job_id: int
    token: int
    owner: str
    task: str
    queue: str
    payload: Any
    attempt: int
    max_attempts: int
    expires_at: dt.datetime
    priority: int = 0
    created_at: dt.datetime | None = None
    lease_seconds: float = 60.0
    payload_version: int | None = None
    unknown_failures: int = 0
    #: Database time of the claim; with ``created_at`` it gives the job's age for budgets.
    claimed_at: dt.datetime | None = None
    #: Key for external calls: the one given at enqueue, else the default the claim
    #: derives from the id and created_at; None only for a lease built by hand.
    idempotency_key: str | None = None
    #: When the job became claimable (database time); claimed_at - available_at is the wait.
    available_at: dt.datetime | None = None
    #: Jobs sharing this key run one at a time, in enqueue order.
    ordering_key: str | None = None
    #: The job's unique key (its completion and failure then update who holds the key).
    unique_key: str | None = None
    #: Claimed under limits: the lease may hold concurrency slots, which the statement that
    #: ends it gives back (which statement that is follows ``slot_rows``).
    limited: bool = False
    #: The claim took slot rows for it (admit() reports them, version 21): the lease may
    #: hold slot rows, which only the statements that delete them may end (a queue
    #: limit's slot is on the job row, which every statement ending a lease clears).
    slot_rows: bool = False
    #: Some job depends on this one: its completion and failure promote dependents.
    has_dependents: bool = False
    #: Local monotonic time the lease object was made (at the claim), for elapsed times.
    claimed_monotonic: float = field(
        default_factory=time.monotonic, repr=False, compare=False, kw_only=True
    )


@dataclass(frozen=True)
class Failure:
    """One failed attempt to report: what went wrong and whether retrying may help."""

    lease: Lease
    error_code: str
    retryable: bool = True
    detail: str | None = None
    retry_in: float | None = None
    #: permanent / transient / unknown; when None, ``retryable`` picks transient/permanent.
    error_class: str | None = None
    #: Overrides the client's retry policy for this failure (a task's own policy).
    policy: RetryPolicy | None = None

    @property
    def effective_class(self) -> ErrorClass:
        if self.error_class is not None:
            return ErrorClass(self.error_class)
        return ErrorClass.TRANSIENT if self.retryable else ErrorClass.PERMANENT


@dataclass(frozen=True)
class Heartbeat:
    """Outcome of renewing a set of leases.

    ``renewed`` maps job id to the new expiry; ``lost`` holds the (job id, token) pairs
    that were refused (a job can appear under an old token while a newer lease lives).
    """

    renewed: dict[int, dt.datetime]
    lost: frozenset[tuple[int, int]]
    cancel_requested: frozenset[int]


@dataclass(frozen=True)
class Job(Printable):
    """A job row as stored (column names follow the table, with ``id`` as ``job_id``)."""

    job_id: int
    queue: str
    task: str
    payload: Any
    status: JobStatus
    priority: int
    available_at: dt.datetime
    attempt_count: int
    max_attempts: int
    lease_owner: str | None
    lease_token: int
    lease_expires_at: dt.datetime | None
    last_error_code: str | None
    last_error_detail: str | None
    created_at: dt.datetime
    started_at: dt.datetime | None
    heartbeat_at: dt.datetime | None
    finished_at: dt.datetime | None
    cancel_requested_at: dt.datetime | None
    payload_version: int | None = None
    last_error_class: str | None = None
    unknown_failures: int = 0
    idempotency_key: str | None = None
    unique_key: str | None = None
    #: A suspended job's reason ('sleep', 'signal') and wake-up time (docs/durable.md).
    suspend_reason: str | None = None
    wake_at: dt.datetime | None = None
    #: The units it takes of every concurrency limit that applies (docs/limits.md).
    cost: int = 1
    #: Why part of the stored row could not be read (e.g. a payload nested too deeply for
    #: Python); the unreadable part is shown as None. None when everything was read.
    unreadable: str | None = None


@dataclass(frozen=True)
class JobEvent(Printable):
    """One row of the audit trail: a transition, who made it, under which token."""

    event_id: int
    job_id: int
    at: dt.datetime
    event: str
    from_status: str | None
    to_status: str | None
    actor: str | None
    lease_token: int | None
    attempt: int | None
    error_code: str | None
    detail: str | None
    error_class: str | None = None


@dataclass(frozen=True)
class SweepResult:
    """What one sweep did with expired leases."""

    requeued: int = 0
    dead: int = 0
    #: Expired leases of jobs an operator had asked to cancel: they end cancelled.
    cancelled: int = 0
    #: Pending jobs past their start deadline (expires=), ended cancelled with EXPIRED (not
    #: leases: not in ``total``).
    expired: int = 0

    @property
    def total(self) -> int:
        return self.requeued + self.dead + self.cancelled

    def __add__(self, other: SweepResult) -> SweepResult:
        return SweepResult(
            self.requeued + other.requeued,
            self.dead + other.dead,
            self.cancelled + other.cancelled,
            self.expired + other.expired,
        )


@dataclass(frozen=True)
class QueueStats(Printable):
    """Per-queue health. Ages are seconds (0 when there is no such job); ``near_expiry``
    counts running jobs whose lease ends within 10 s; ``finished_recently`` counts jobs
    finished in the last minute (None unless asked for: it scans history)."""

    queue: str
    ready: int
    scheduled: int
    running: int
    dead: int
    oldest_ready_age: float
    oldest_dead_age: float
    near_expiry: int
    finished_recently: int | None = None

    def as_dict(self) -> dict[str, Any]:
        """As JSON: an age is null where there is no such job (the table's ``-``)."""
        found = super().as_dict()
        found["oldest_ready_age"] = self.oldest_ready_age if self.ready else None
        found["oldest_dead_age"] = self.oldest_dead_age if self.dead else None
        return found


@dataclass(frozen=True)
class QueueScaling(Printable):
    """A queue's autoscaling signal (the ``autoscaling`` view, docs/autoscaling.md):
    ``claimable`` jobs due now (0 while the queue is paused), ``running``, the oldest
    claimable job's wait in seconds, the handlers per worker (``concurrency``, set with
    ``set_scaling``; 10 by default), the bounds, the queue's concurrency limit, and
    ``suggested_workers``."""

    queue: str
    claimable: int
    running: int
    oldest_wait: float
    paused: bool
    concurrency: int
    min_workers: int
    max_workers: int | None
    queue_limit: int | None
    suggested_workers: int


class JobFilter(TypedDict, total=False):
    """The operator filter of listing, counting, bulk replay and purge; None matches all.
    Ages are seconds since the job finished."""

    queue: str | None
    task: str | None
    error_code: str | None
    older_than: float | None
    newer_than: float | None


@dataclass(frozen=True)
class JobResult(Printable):
    """A job's outcome as ``result()`` reads it: ``status``, the stored ``value`` when
    ``stored`` (tasks with store_result=True, until its result_ttl ends), and the last
    failure (code, class, detail) of a job that did not succeed."""

    job_id: int
    status: str
    stored: bool
    value: Any
    error_code: str | None
    error_class: str | None
    error_detail: str | None
    stored_at: dt.datetime | None


@dataclass(frozen=True)
class BatchInfo(Printable):
    """A batch as ``leaseq batches show`` prints it: state (open, sealed, done), times,
    its callbacks' tasks, its jobs' counts by status and the callback jobs by kind."""

    id: int
    state: str
    created_at: dt.datetime
    sealed_at: dt.datetime | None
    finished_at: dt.datetime | None
    on_success: str | None
    on_failure: str | None
    on_finish: str | None
    counts: dict[str, int]
    callbacks: dict[str, int]


@dataclass(frozen=True)
class Dependency(Printable):
    """One edge seen from either end: the other job, the edge's policy for a dependency
    that ends dead or cancelled, the other job's status (None once pruned), and, for a
    dependent, whether it still waits."""

    job_id: int
    on_dead: str
    status: str | None
    waiting: bool = False


@dataclass(frozen=True)
class UniqueKeyHolder(Printable):
    """Who holds a unique key: ``job_id`` (None: nobody), live (``held_until`` None) or
    only for the window after that job finished, until ``held_until``."""

    key: str
    job_id: int | None
    held_until: dt.datetime | None


@dataclass(frozen=True)
class BlockedKey(Printable):
    """An ordering key held up by its dead head (policy ``block``)."""

    key: str
    head_job_id: int
    task: str
    queue: str
    error_code: str | None
    dead_since: dt.datetime | None
    waiting: int


@dataclass(frozen=True)
class EffectRecord(Printable):
    """The durable record of one external effect a job declared (see ``JobContext.effect``).

    ``status``: ``started`` (in flight, or — seen by a later attempt — *uncertain*),
    ``done`` (with its JSON ``result``) or ``failed`` (it certainly did not happen).
    """

    name: str
    key: str
    status: str
    attempt: int
    lease_token: int
    started_at: dt.datetime
    finished_at: dt.datetime | None
    result: Any
    error: str | None


@dataclass(frozen=True)
class StepRecord(Printable):
    """The durable record of one finished step of a job (see ``JobContext.step``): its
    name, its place in the handler's order (0-based), the attempt and lease token that
    recorded it, and its JSON ``result`` (what every later attempt gets back)."""

    name: str
    seq: int
    attempt: int
    lease_token: int
    recorded_at: dt.datetime
    result: Any


@dataclass(frozen=True)
class SuspendedStats(Printable):
    """Suspended jobs of one queue for one reason (``sleep``, ``signal``): how many, and
    how many seconds the most overdue wake-up is late (0: none is due)."""

    queue: str
    reason: str | None
    count: int
    overdue: float
