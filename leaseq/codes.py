"""Error codes leaseq itself writes to ``last_error_code`` and the event trail: the one
source for Python and for the SQL (``leaseq/sql/queries/`` names them as ``{code:NAME}``, checked
against this enum when the statements are loaded). Handlers' own codes are free text."""

from __future__ import annotations

from enum import StrEnum


class ErrorCode(StrEnum):
    #: The sweeper found the lease expired (worker crashed, stalled or lost its connection).
    LEASE_EXPIRED = "LEASE_EXPIRED"
    #: The worker's local deadline passed without a confirmed renewal: it stopped the handler.
    LEASE_LOST = "LEASE_LOST"
    #: No handler for the job's task in this worker's app.
    UNKNOWN_TASK = "UNKNOWN_TASK"
    #: The job's payload version is not one the task accepts.
    UNSUPPORTED_PAYLOAD_VERSION = "UNSUPPORTED_PAYLOAD_VERSION"
    #: The task's validate hook refused the payload, or the stored row cannot be decoded.
    INVALID_PAYLOAD = "INVALID_PAYLOAD"
    #: The handler's fenced transaction could not commit its completion.
    COMPLETION_NOT_COMMITTED = "COMPLETION_NOT_COMMITTED"
    #: No ``ctx.progress()`` within a lease length (renew="progress").
    NO_PROGRESS = "NO_PROGRESS"
    #: The task's ``max_runtime`` passed.
    MAX_RUNTIME_EXCEEDED = "MAX_RUNTIME_EXCEEDED"
    #: An operator asked for the job to be cancelled while it ran.
    CANCELLED = "CANCELLED"
    #: The worker shut down before the handler finished.
    WORKER_SHUTDOWN = "WORKER_SHUTDOWN"
    #: An external effect was started and its outcome could not be established.
    UNCERTAIN_EFFECT = "UNCERTAIN_EFFECT"
    #: A stored row holds what the claim cannot turn into a lease (a counter at its maximum,
    #: a time that is not finite); the claim ended it dead instead of failing its batch.
    ROW_OUT_OF_RANGE = "ROW_OUT_OF_RANGE"
    #: The job's cost is above the concurrency of a limit that applies to it: it could never
    #: start, so the claim ended it dead (docs/limits.md, "Job cost").
    COST_OVER_LIMIT = "COST_OVER_LIMIT"
    #: A retry of a job whose unique key moved to a follow-up job: it ends cancelled instead
    #: of becoming a second live job with the key.
    SUPERSEDED = "SUPERSEDED"
    #: A dependency ended dead or cancelled under the "cancel" policy: this job never ran.
    DEPENDENCY_FAILED = "DEPENDENCY_FAILED"
    #: The handler's return value was over the stored-result size cap (store_result=True).
    RESULT_TOO_LARGE = "RESULT_TOO_LARGE"
    #: The handler's return value cannot be stored as JSON (store_result=True).
    RESULT_INVALID = "RESULT_INVALID"
    #: A sealed (encrypted) value names a key the process does not have (docs/encryption.md).
    ENCRYPTION_KEY_MISSING = "ENCRYPTION_KEY_MISSING"
    #: A sealed value did not authenticate under its key: changed, or sealed as another kind.
    ENCRYPTION_FAILED = "ENCRYPTION_FAILED"
    #: An offloaded payload is not in its store (deleted by hand, or a store that lost it).
    PAYLOAD_MISSING = "PAYLOAD_MISSING"
    #: A handler called ``ctx.step`` twice with one name in one run (or a step inside a step).
    STEP_NAME_REUSED = "STEP_NAME_REUSED"
    #: A handler's steps came in another order than the one its earlier attempts recorded
    #: (the code changed under an in-flight job: branch with ``ctx.patched``).
    STEP_OUT_OF_ORDER = "STEP_OUT_OF_ORDER"
    #: A step's return value cannot be recorded as JSON (or is over the payload limit).
    STEP_RESULT_INVALID = "STEP_RESULT_INVALID"
    #: The job was not started by its start deadline (expires=): it ended cancelled, unrun.
    EXPIRED = "EXPIRED"
    #: ``ctx.wait_for`` waited its whole timeout and the signal never came (uncaught).
    WAIT_TIMEOUT = "WAIT_TIMEOUT"
    #: ``ctx.gather``: a child ended dead or cancelled (uncaught ChildFailed).
    CHILD_FAILED = "CHILD_FAILED"
    #: A job with an ordering key called ``ctx.sleep``, ``ctx.wait_for`` or a ``ctx.gather``
    #: that would wait: it cannot be suspended (its key's order would not hold).
    SUSPEND_REFUSED = "SUSPEND_REFUSED"
