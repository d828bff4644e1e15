"""What a worker runs for a Django task: the job's payload names the task by module path;
stale Django database connections are closed before and after each job, as Celery's
Django fixup does (honouring ``CONN_MAX_AGE``)."""

from __future__ import annotations

from typing import Any

from django.db import connections
from django.utils.module_loading import import_string

from leaseq.codes import ErrorCode
from leaseq.contrib.django import _tasks
from leaseq.errors import Permanent
from leaseq.worker.context import JobContext

#: The leaseq task name of every Django task's job.
DISPATCH_TASK = "leaseq.contrib.django.run"


def payload_for(task: Any, args: Any, kwargs: Any) -> dict[str, Any]:
    return {"task": task.module_path, "args": list(args), "kwargs": dict(kwargs)}


def load_task(path: str) -> Any:
    try:
        found = import_string(path)
    except ImportError as exc:
        raise Permanent(ErrorCode.UNKNOWN_TASK, f"cannot import {path}: {exc}") from None
    if not isinstance(found, _tasks.Task):
        raise Permanent(ErrorCode.UNKNOWN_TASK, f"{path} is not a django.tasks task")
    return found


def close_stale_connections() -> None:
    """Django's ``close_old_connections``, except for a connection inside an ``atomic()``
    block: a job run on the caller's transaction (the testing kit's ``drain``) must not
    close it."""
    for conn in connections.all(initialized_only=True):
        if not conn.in_atomic_block:
            conn.close_if_unusable_or_obsolete()


def run_django_task(ctx: JobContext, payload: dict[str, Any]) -> Any:
    close_stale_connections()
    try:
        task = load_task(payload["task"])
        args, kwargs = payload.get("args", []), payload.get("kwargs", {})
        if task.takes_context:
            result = result_for_context(task, ctx, args, kwargs)
            return task.call(_tasks.TaskContext(task_result=result), *args, **kwargs)
        return task.call(*args, **kwargs)
    finally:
        close_stale_connections()


def result_for_context(task: Any, ctx: JobContext, args: Any, kwargs: Any) -> Any:
    """The TaskResult a ``takes_context`` task sees while it runs."""
    return _tasks.TaskResult(
        task=task,
        id=str(ctx.job_id),
        status=_tasks.TaskResultStatus.RUNNING,
        enqueued_at=None,
        started_at=None,
        last_attempted_at=None,
        finished_at=None,
        args=args,
        kwargs=kwargs,
        backend=task.backend,
        errors=[],
        worker_ids=[ctx.worker_id] * ctx.attempt,
    )
