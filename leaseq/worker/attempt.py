"""The decisions of one attempt, pure: what a worker (``leaseq.worker.executor``) and the
testing kit (``leaseq.testing.perform``) do with a claimed job, so the two cannot drift.

- a task this app does not know: :func:`unknown_task`, a permanent ``UNKNOWN_TASK``;
- a payload the task refuses: :func:`prepare_payload`, a permanent
  ``UNSUPPORTED_PAYLOAD_VERSION`` or ``INVALID_PAYLOAD``, before the handler runs;
- what the handler raised: :func:`failure_of`, classified by the task's rules;
- what it returned, for a task that stores its result: :func:`result_of`, the JSON to
  store, or a permanent ``RESULT_TOO_LARGE`` / ``RESULT_INVALID``.

No I/O, no clock: the caller runs the handler and reports the outcome.
"""

from __future__ import annotations

import traceback
from typing import Any

from leaseq.app import Task
from leaseq.codes import ErrorCode
from leaseq.errors import PayloadError, Permanent, Retry
from leaseq.models import Failure, Lease
from leaseq.retry import ErrorClass
from leaseq.validate import encode_payload

#: A stored result: its JSON text and the seconds it is kept (the completion's ``results``).
StoredResult = tuple[str, float]


def unknown_task(lease: Lease) -> Failure:
    """The job names a task the app has no handler for: it cannot succeed here, ever."""
    return Failure(
        lease,
        ErrorCode.UNKNOWN_TASK,
        error_class=ErrorClass.PERMANENT,
        detail=f"no handler registered for task {lease.task!r} in this app",
    )


def prepare_payload(task: Task[Any], lease: Lease) -> tuple[Any, Failure | None]:
    """Check (and convert) the payload before the handler runs. A refusal is permanent —
    retrying cannot fix a payload — so the job goes dead at once with a clear code."""
    versions = task.payload_versions
    if versions is not None and lease.payload_version not in versions:
        return None, Failure(
            lease,
            ErrorCode.UNSUPPORTED_PAYLOAD_VERSION,
            error_class=ErrorClass.PERMANENT,
            detail=(
                f"payload version {lease.payload_version} is not one task {task.name} "
                f"accepts ({', '.join(map(str, sorted(versions)))})"
            ),
        )
    if task.validate is None:
        return lease.payload, None
    try:
        return task.validate(lease.payload), None
    except Exception as exc:
        return None, Failure(
            lease,
            ErrorCode.INVALID_PAYLOAD,
            error_class=ErrorClass.PERMANENT,
            detail=f"{type(exc).__name__}: {exc}",
        )


def failure_of(lease: Lease, task: Task[Any], exc: BaseException) -> Failure:
    """What a handler raised, classified: the failure to report."""
    error_class, code = task.classifier.classify(exc)
    if isinstance(exc, Permanent | Retry):
        detail = exc.detail
    else:  # unclassified or rule-matched: keep the whole (bounded) traceback
        detail = "".join(traceback.format_exception(exc))
    return Failure(
        lease,
        code,
        error_class=error_class,
        detail=detail,
        retry_in=exc.retry_in if isinstance(exc, Retry) else None,
        policy=task.retry,
    )


def result_of(
    lease: Lease, task: Task[Any], value: Any
) -> tuple[Lease | Failure, StoredResult | None]:
    """What a handler returned: success with nothing to store (the task stores no result),
    success with the JSON to store, or — when the value cannot be stored — a permanent
    failure saying why."""
    if not task.store_result:
        return lease, None
    try:
        return lease, (encode_payload(value, task.result_limit), task.result_ttl)
    except PayloadError as exc:
        message = str(exc).replace("payload", "result", 1)
        too_large = "over the limit" in message
        code = ErrorCode.RESULT_TOO_LARGE if too_large else ErrorCode.RESULT_INVALID
        return Failure(lease, code, error_class=ErrorClass.PERMANENT, detail=message), None
