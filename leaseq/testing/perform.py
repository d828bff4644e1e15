"""Running jobs inside a test: ``perform_job`` (one task, one payload, a real lease) and
``drain`` (every runnable job, optionally on the test's own connection).

Both go through the real protocol: the job is stored (so the payload makes a JSON round
trip through jsonb), claimed under a real fenced lease, the handler runs with a real
``JobContext``, and the outcome is decided by the worker's own rules
(``leaseq.worker.attempt``: an unknown task, a refused payload, the failure's class, a
result that cannot be stored) and recorded by the fenced complete/fail statements with the
task's retry policy; a task's stored result is stored as a worker stores it. Unlike a
worker they renew no lease (handlers run in the caller's thread) and run one job at a time.

With ``connection=`` everything joins that connection's open transaction: jobs a test
enqueued there but never commits can be run, and a rollback undoes the lot. Handlers then
have no ``ctx.effect``/``ctx.transaction`` (those need connections of their own, which
would wait on the uncommitted job row), and each handler runs inside a savepoint, undone
if it raises.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Unpack

import psycopg

from leaseq.app import App, Task
from leaseq.client import Client
from leaseq.client_async import AsyncClient
from leaseq.jobspec import EnqueueOptions
from leaseq.models import Failure, Lease
from leaseq.states import JobStatus
from leaseq.testing import clock
from leaseq.testing.assertions import database_now, on_connection
from leaseq.worker.attempt import failure_of, prepare_payload, result_of, unknown_task
from leaseq.worker.context import JobContext, JobServices

WORKER_ID = "leaseq-testing"
#: Long enough that no test's handler outlives it: the kit renews no lease.
LEASE_SECONDS = 3600.0


@dataclass(frozen=True)
class Outcome:
    """What one attempt led to. ``status`` is ``succeeded``, ``retry`` (``retry_in``
    seconds from now on the database clock), ``dead`` or ``cancelled``; ``result`` is
    what the handler returned (stored too, as a worker stores it, when the task has
    ``store_result=True``; a value that cannot be stored ends the job dead with
    ``RESULT_TOO_LARGE`` or ``RESULT_INVALID``, as on a worker)."""

    job_id: int
    task: str
    status: str
    result: Any = None
    error_code: str | None = None
    error_class: str | None = None
    detail: str | None = None
    retry_in: float | None = None

    @property
    def succeeded(self) -> bool:
        return self.status == "succeeded"


@dataclass
class DrainSummary:
    """What ``drain`` ran: counts per outcome, and every outcome in order."""

    succeeded: int = 0
    retried: int = 0
    dead: int = 0
    cancelled: int = 0
    outcomes: list[Outcome] = field(default_factory=list)

    def add(self, outcome: Outcome) -> None:
        self.outcomes.append(outcome)
        if outcome.status == "succeeded":
            self.succeeded += 1
        elif outcome.status == "retry":
            self.retried += 1
        elif outcome.status == "dead":
            self.dead += 1
        else:
            self.cancelled += 1


Connection = psycopg.Connection[Any]


def perform_job(
    client: Client,
    task: Task[Any],
    payload: Any = None,
    *,
    connection: Connection | None = None,
    **options: Unpack[EnqueueOptions],
) -> Outcome:
    """Enqueue ``payload`` for ``task`` as ``task.enqueue`` would (its defaults, its payload
    check; options as in ``Client.enqueue``), claim it under a real lease and run the
    handler once; returns the outcome. The job goes to a queue of its own, so other jobs of
    the task's queue are left alone."""
    merged = task._options(payload, options)
    merged["queue"] = queue = f"leaseq-testing-{uuid.uuid4().hex[:12]}"
    job_id = client.enqueue(task.name, payload, connection=connection, **merged)
    leases = client.claim(
        queue,
        worker=WORKER_ID,
        lease_seconds=LEASE_SECONDS,
        connection=connection,
    )
    if not leases or leases[0].job_id != job_id:
        raise AssertionError(f"job {job_id} could not be claimed (is it scheduled later?)")
    return _run(client, task.app, leases[0], connection)


def drain(
    client: Client,
    app: App,
    queue: str | None = None,
    *,
    connection: Connection | None = None,
    include_scheduled: bool = False,
    max_jobs: int = 1000,
) -> DrainSummary:
    """Run runnable jobs (of ``queue``, or of every queue with pending jobs) one at a time
    until none is left or ``max_jobs`` ran, jobs enqueued by jobs included; returns a
    summary. A job whose task ``app`` does not know ends dead with ``UNKNOWN_TASK``, as it
    would on a worker of that app.

    ``include_scheduled`` also runs jobs whose time has not come, by moving the test clock
    (``leaseq.testing.clock``) to each one's time first: it needs the clock in the
    connection's ``search_path``. A retried job is scheduled later, so without it each job
    runs at most once per drain.
    """
    summary = DrainSummary()
    while len(summary.outcomes) < max_jobs:
        lease = _next_lease(client, queue, connection, include_scheduled)
        if lease is None:
            break
        summary.add(_run(client, app, lease, connection))
    return summary


def _next_lease(
    client: Client, queue: str | None, connection: Connection | None, include_scheduled: bool
) -> Lease | None:
    pending = client.list_jobs("pending", limit=10_000, connection=connection, queue=queue)
    if not pending:
        return None
    for name in sorted({job.queue for job in pending}):
        leases = client.claim(
            name, worker=WORKER_ID, lease_seconds=LEASE_SECONDS, connection=connection
        )
        if leases:
            return leases[0]
    if not include_scheduled:
        return None
    earliest = min(job.available_at for job in pending)
    with on_connection(client, connection) as conn:
        gap = (earliest - database_now(conn)).total_seconds()
        clock.advance(conn, max(gap, 0.0))
    return _next_lease(client, queue, connection, include_scheduled=False)


def _run(client: Client, app: App, lease: Lease, connection: Connection | None) -> Outcome:
    """One attempt, decided as a worker decides it (``leaseq.worker.attempt``): an unknown
    task, a refused payload, what the handler raised, and what it returned (a result that
    cannot be stored fails the job as it would on a worker) are the worker's own rules."""
    task = app.tasks.get(lease.task)
    if task is None:
        return _report(client, unknown_task(lease), None, connection)
    payload, refused = prepare_payload(task, lease)
    if refused is not None:
        return _report(client, refused, task, connection)
    services = None if connection is not None else _services(client, task)
    ctx = JobContext(lease, WORKER_ID, services)
    ctx.mark_started()
    try:
        with _savepoint(connection):
            value = _call(task, ctx, payload, client, services)
    except Exception as exc:
        return _report(client, failure_of(lease, task, exc), task, connection)
    if ctx.completed:  # the handler joined the completion to its own transaction
        return Outcome(lease.job_id, lease.task, "succeeded", value)
    outcome, stored = result_of(lease, task, value)
    if isinstance(outcome, Failure):
        return _report(client, outcome, task, connection)
    results = {lease.job_id: stored} if stored is not None else None
    if lease.job_id not in client.complete_many([lease], connection=connection, results=results):
        raise AssertionError(f"job {lease.job_id}: the lease was lost before completion")
    return Outcome(lease.job_id, lease.task, "succeeded", value)


@contextlib.contextmanager
def _savepoint(connection: Connection | None) -> Iterator[None]:
    if connection is None:
        yield
        return
    with connection.transaction():
        yield


def _services(client: Client, task: Task[Any]) -> JobServices:
    return JobServices(
        sync_client=None if task.is_async else (lambda: client),
        async_client=None,  # async handlers get theirs in _call, on their own loop
        reconcilers=task.reconcile,
    )


def _call(
    task: Task[Any], ctx: JobContext, payload: Any, client: Client, services: JobServices | None
) -> Any:
    if not task.is_async:
        return task.fn(ctx, payload)
    return _run_coroutine(task, ctx, payload, client, services)


def _run_coroutine(
    task: Task[Any], ctx: JobContext, payload: Any, client: Client, services: JobServices | None
) -> Any:
    """An async handler on an event loop of its own (in a thread when the test itself runs
    on a loop), with an async client on that loop for its effects and transactions."""

    async def main() -> Any:
        aclient = None
        if services is not None:
            aclient = AsyncClient(client.dsn(), **task.app.client_options())
            services.async_client = aclient
        try:
            return await task.fn(ctx, payload)
        finally:
            if aclient is not None:
                await aclient.close()

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(main())
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = asyncio.run(main())
        except BaseException as exc:
            box["error"] = exc

    thread = threading.Thread(target=target, name="leaseq-testing-async")
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box.get("value")


def _report(
    client: Client, failure: Failure, task: Task[Any] | None, connection: Connection | None
) -> Outcome:
    lease = failure.lease
    statuses = client.fail_many([failure], connection=connection)
    status = statuses.get(lease.job_id)
    if status is None:
        raise AssertionError(f"job {lease.job_id}: the lease was lost before the failure")
    retry_in = None
    job = client.get_job(lease.job_id, connection=connection)
    if status is JobStatus.PENDING and job is not None:
        with on_connection(client, connection) as conn:
            retry_in = max(0.0, (job.available_at - database_now(conn)).total_seconds())
    return Outcome(
        lease.job_id,
        lease.task,
        "retry" if status is JobStatus.PENDING else str(status),
        error_code=failure.error_code,
        error_class=str(failure.effective_class),
        detail=failure.detail,
        retry_in=retry_in,
    )
