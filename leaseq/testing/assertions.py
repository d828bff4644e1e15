"""What a test asserts about enqueued jobs: ``assert_enqueued`` (returning the job),
``refute_enqueued`` and ``enqueued_jobs``, read through the real client (or the test's
own connection, to see its uncommitted jobs)."""

from __future__ import annotations

import contextlib
import datetime as dt
from collections.abc import Iterator, Mapping
from typing import Any

import psycopg

from leaseq.app import Task
from leaseq.client import Client
from leaseq.models import Job

#: How many jobs an assertion looks at, at most.
LIMIT = 10_000


def task_name(task: Task[Any] | str) -> str:
    return task.name if isinstance(task, Task) else task


def enqueued_jobs(
    client: Client,
    task: Task[Any] | str | None = None,
    *,
    queue: str | None = None,
    connection: psycopg.Connection[Any] | None = None,
) -> list[Job]:
    """Jobs waiting to run (pending, including scheduled ones), oldest first."""
    name = None if task is None else task_name(task)
    jobs = client.list_jobs("pending", limit=LIMIT, connection=connection, task=name, queue=queue)
    return sorted(jobs, key=lambda job: job.job_id)


def matches(value: Any, subset: Any) -> bool:
    """``subset`` is contained in ``value``: mappings key by key (recursively), anything
    else by equality."""
    if isinstance(subset, Mapping):
        return isinstance(value, Mapping) and all(
            key in value and matches(value[key], want) for key, want in subset.items()
        )
    return bool(value == subset)


def _select(
    client: Client,
    task: Task[Any] | str,
    payload_subset: Any,
    queue: str | None,
    within: float | None,
    connection: psycopg.Connection[Any] | None,
) -> tuple[list[Job], list[Job]]:
    candidates = enqueued_jobs(client, task, queue=queue, connection=connection)
    found = [
        job for job in candidates if payload_subset is None or matches(job.payload, payload_subset)
    ]
    if within is not None:
        with on_connection(client, connection) as conn:
            limit = database_now(conn) + dt.timedelta(seconds=within)
        found = [job for job in found if job.available_at <= limit]
    return found, candidates


def database_now(conn: psycopg.Connection[Any]) -> dt.datetime:
    """The time leaseq's statements see on ``conn`` (the test clock, when in its path)."""
    row = conn.execute("SELECT now()").fetchone()
    assert row is not None
    value: dt.datetime = row[0]
    return value


@contextlib.contextmanager
def on_connection(
    client: Client, connection: psycopg.Connection[Any] | None
) -> Iterator[psycopg.Connection[Any]]:
    """The caller's connection, or a pooled one of the client's."""
    if connection is not None:
        yield connection
        return
    with client.connection() as conn:
        yield conn


def _describe(
    task: Task[Any] | str, payload_subset: Any, queue: str | None, within: float | None
) -> str:
    parts = [f"task {task_name(task)!r}"]
    if payload_subset is not None:
        parts.append(f"payload containing {payload_subset!r}")
    if queue is not None:
        parts.append(f"queue {queue!r}")
    if within is not None:
        parts.append(f"runnable within {within:g}s")
    return ", ".join(parts)


def assert_enqueued(
    client: Client,
    task: Task[Any] | str,
    *,
    payload_subset: Any = None,
    queue: str | None = None,
    within: float | None = None,
    connection: psycopg.Connection[Any] | None = None,
) -> Job:
    """The newest pending job of ``task`` whose payload contains ``payload_subset``, on
    ``queue`` if given, runnable within ``within`` seconds of the database clock if given;
    AssertionError (listing what was enqueued) when there is none."""
    found, candidates = _select(client, task, payload_subset, queue, within, connection)
    if found:
        return found[-1]
    seen = "\n".join(
        f"  job {job.job_id} queue={job.queue} available_at={job.available_at:%H:%M:%S} "
        f"payload={job.payload!r}"
        for job in candidates[:20]
    )
    raise AssertionError(
        f"no job enqueued for {_describe(task, payload_subset, queue, within)}; "
        + (f"pending jobs of that task:\n{seen}" if seen else "none of that task is pending")
    )


def refute_enqueued(
    client: Client,
    task: Task[Any] | str,
    *,
    payload_subset: Any = None,
    queue: str | None = None,
    within: float | None = None,
    connection: psycopg.Connection[Any] | None = None,
) -> None:
    """AssertionError when a pending job matches (the same matching as ``assert_enqueued``)."""
    found, _ = _select(client, task, payload_subset, queue, within, connection)
    if found:
        ids = ", ".join(str(job.job_id) for job in found[:20])
        raise AssertionError(
            f"expected no job for {_describe(task, payload_subset, queue, within)}, "
            f"found {len(found)}: {ids}"
        )
