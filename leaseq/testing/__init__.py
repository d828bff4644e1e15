"""leaseq's testing kit for applications' own test suites: a database per test (cloned
from a migrated template), assertions on enqueued jobs, ``perform_job`` and ``drain`` (on
the test's own connection when given), and a test clock for leaseq's statements.

The pytest plugin (``leaseq.testing.plugin``, registered through the ``pytest11`` entry
point) provides the fixtures ``leaseq_dsn``, ``leaseq_client``, ``leaseq_clock`` and
``leaseq_testing`` (a :class:`Kit`). See docs/testing.md.
"""

from __future__ import annotations

from typing import Any, Unpack

import psycopg

from leaseq.app import App, Task
from leaseq.client import Client
from leaseq.jobspec import EnqueueOptions
from leaseq.models import Job
from leaseq.testing.assertions import assert_enqueued, enqueued_jobs, refute_enqueued
from leaseq.testing.clock import CLOCK_OPTIONS, Clock, with_clock
from leaseq.testing.perform import DrainSummary, Outcome, drain, perform_job

__all__ = [
    "CLOCK_OPTIONS",
    "Clock",
    "DrainSummary",
    "Kit",
    "Outcome",
    "assert_enqueued",
    "drain",
    "enqueued_jobs",
    "perform_job",
    "refute_enqueued",
    "with_clock",
]

Connection = psycopg.Connection[Any]


class Kit:
    """The kit's functions bound to one client (and its database's clock)."""

    def __init__(self, client: Client, clock: Clock | None = None) -> None:
        self.client = client
        self.clock = clock

    def enqueued_jobs(
        self,
        task: Task[Any] | str | None = None,
        *,
        queue: str | None = None,
        connection: Connection | None = None,
    ) -> list[Job]:
        return enqueued_jobs(self.client, task, queue=queue, connection=connection)

    def assert_enqueued(
        self,
        task: Task[Any] | str,
        *,
        payload_subset: Any = None,
        queue: str | None = None,
        within: float | None = None,
        connection: Connection | None = None,
    ) -> Job:
        return assert_enqueued(
            self.client,
            task,
            payload_subset=payload_subset,
            queue=queue,
            within=within,
            connection=connection,
        )

    def refute_enqueued(
        self,
        task: Task[Any] | str,
        *,
        payload_subset: Any = None,
        queue: str | None = None,
        within: float | None = None,
        connection: Connection | None = None,
    ) -> None:
        refute_enqueued(
            self.client,
            task,
            payload_subset=payload_subset,
            queue=queue,
            within=within,
            connection=connection,
        )

    def perform_job(
        self,
        task: Task[Any],
        payload: Any = None,
        *,
        connection: Connection | None = None,
        **options: Unpack[EnqueueOptions],
    ) -> Outcome:
        return perform_job(self.client, task, payload, connection=connection, **options)

    def drain(
        self,
        app: App,
        queue: str | None = None,
        *,
        connection: Connection | None = None,
        include_scheduled: bool = False,
        max_jobs: int = 1000,
    ) -> DrainSummary:
        return drain(
            self.client,
            app,
            queue,
            connection=connection,
            include_scheduled=include_scheduled,
            max_jobs=max_jobs,
        )
