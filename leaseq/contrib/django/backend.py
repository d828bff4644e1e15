"""``LeaseqBackend``: a ``django.tasks`` backend storing each enqueued task as a leaseq job.

``enqueue`` runs on Django's own connection of the backend's database, so inside
``atomic()`` the job commits or rolls back with the block. ``get_result`` reads the job's
state: READY (pending, also between retries), RUNNING, SUCCESSFUL, FAILED (dead or
cancelled, with the last error). Return values are stored by the job's fenced completion
(the dispatch task has store_result=True; docs/results.md), so a SUCCESSFUL result's
``return_value`` is the task's return value while it is kept (result_ttl, 7 days).

    TASKS = {"default": {"BACKEND": "leaseq.contrib.django.LeaseqBackend",
                         "QUEUES": ["default"], "OPTIONS": {"DATABASE": "default"}}}
"""

from __future__ import annotations

from typing import Any

from leaseq.contrib.django import _tasks
from leaseq.contrib.django.connection import connection_for, leaseq_app
from leaseq.contrib.django.runtime import DISPATCH_TASK, load_task, payload_for
from leaseq.errors import Permanent
from leaseq.models import Job
from leaseq.owners import worker_of

_STATUS = {
    "pending": "READY",
    "running": "RUNNING",
    "succeeded": "SUCCESSFUL",
    "dead": "FAILED",
    "cancelled": "FAILED",
}


class LeaseqBackend(_tasks.BaseTaskBackend):
    supports_defer = True
    supports_async_task = False  # the worker runs Django tasks as sync handlers
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        #: The database alias whose transaction enqueue joins (default: LEASEQ["DATABASE"]).
        self.database: str | None = self.options.get("DATABASE")

    def enqueue(self, task: Any, args: Any, kwargs: Any) -> Any:
        self.validate_task(task)
        payload = payload_for(task, args, kwargs)
        job_id = leaseq_app().client.enqueue(
            DISPATCH_TASK,
            payload,
            queue=task.queue_name,
            priority=task.priority,
            run_at=task.run_after,
            connection=connection_for(self.database),
        )
        return self._result(task, str(job_id), "READY", payload["args"], payload["kwargs"])

    def get_result(self, result_id: str) -> Any:
        try:
            job = leaseq_app().client.get_job(int(result_id))
        except ValueError:
            job = None
        if job is None or job.task != DISPATCH_TASK or not isinstance(job.payload, dict):
            raise _tasks.TaskResultDoesNotExist(result_id)
        try:
            task = load_task(job.payload["task"])
        except Permanent:
            raise _tasks.TaskResultDoesNotExist(result_id) from None
        return self._from_job(task, job)

    def _result(self, task: Any, result_id: str, status: str, args: Any, kwargs: Any) -> Any:
        return _tasks.TaskResult(
            task=task,
            id=result_id,
            status=_tasks.TaskResultStatus[status],
            enqueued_at=None,
            started_at=None,
            last_attempted_at=None,
            finished_at=None,
            args=args,
            kwargs=kwargs,
            backend=self.alias,
            errors=[],
            worker_ids=[],
        )

    def _from_job(self, task: Any, job: Job) -> Any:
        errors = []
        if job.last_error_code and job.status in ("dead", "cancelled"):
            errors.append(
                _tasks.TaskError(
                    exception_class_path=job.last_error_code,
                    traceback=job.last_error_detail or "",
                )
            )
        result = _tasks.TaskResult(
            task=task,
            id=str(job.job_id),
            status=_tasks.TaskResultStatus[_STATUS[str(job.status)]],
            enqueued_at=job.created_at,
            started_at=job.started_at,
            last_attempted_at=job.started_at,
            finished_at=job.finished_at,
            args=job.payload.get("args", []),
            kwargs=job.payload.get("kwargs", {}),
            backend=self.alias,
            errors=errors,
            # The worker, not the claim: lease_owner is "<worker id>/<claim>" (leaseq.owners).
            worker_ids=[worker_of(job.lease_owner)] if job.lease_owner else [],
        )
        if job.status == "succeeded":
            stored = leaseq_app().client.job_result(job.job_id)
            if stored is not None and stored.stored:
                # TaskResult is frozen and takes no return value: set as Django's own does.
                object.__setattr__(result, "_return_value", stored.value)
        return result
