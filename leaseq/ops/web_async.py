"""The web dashboard's reads: every one runs in a short transaction that first sets a
statement timeout (``web_statement_timeout``), and every one returns a bounded number of
rows, on the read replica when the client has one (``read_dsn``). Actions do not live here:
the dashboard calls the same audited operations as the CLI (replay, purge, cancel, skip,
pause, resume), on the primary.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any, NamedTuple, Unpack

from leaseq import validate
from leaseq.models import (
    BatchInfo,
    BlockedKey,
    Dependency,
    EffectRecord,
    Job,
    JobEvent,
    JobFilter,
    JobResult,
    QueueScaling,
    QueueStats,
    StepRecord,
    UniqueKeyHolder,
)
from leaseq.ops.base_async import AsyncClientBase, Row
from leaseq.params import job_filter
from leaseq.rows import effect_from_row, event_from_row, job_from_row, stats_from_row
from leaseq.rules.fairness import TOP_KEYS, FairKey, fair_keys_from_rows
from leaseq.rules.limits import Limit, limit_from_row
from leaseq.rules.pauses import Pause, pauses_from_rows


class JobFlags(NamedTuple):
    """What the job page shows that models.Job does not carry."""

    ordering_key: str | None
    waiting: bool
    blocked: bool


class JobLinks(NamedTuple):
    """The job page's workflow view: what the job waits for, what waits for it (the first
    100), its batch and its stored result (as stored: a sealed value stays sealed)."""

    dependencies: list[Dependency]
    dependents: list[Dependency]
    batch: BatchInfo | None
    result: JobResult | None


class WorkerLeases(NamedTuple):
    """/workers: one lease owner's running jobs now."""

    owner: str
    running: int
    oldest_start: dt.datetime | None
    last_heartbeat: dt.datetime | None
    stale: int
    job_ids: list[int]


class TaskStats(NamedTuple):
    """/tasks: one task's outcomes and run times over the window."""

    task: str
    succeeded: int
    dead: int
    p50: float | None
    p95: float | None
    p99: float | None
    failure_rate: float


class DeadGroup(NamedTuple):
    """/dead by error code."""

    error_code: str | None
    jobs: int
    newest: dt.datetime | None
    oldest: dt.datetime | None
    example: int


#: How many of the newest jobs the throughput sparkline looks at (a primary-key range).
THROUGHPUT_WINDOW = 100_000

#: How many of the newest jobs the task and error code suggestions come from.
SUGGEST_WINDOW = 20_000


class AsyncWebOps(AsyncClientBase):
    #: Milliseconds a dashboard statement may run before the server cancels it.
    web_timeout_ms: int = 5000

    async def _web_rows(
        self, reads: list[tuple[str, Mapping[str, Any] | None]], *, tolerant: bool = False
    ) -> list[list[Row]]:
        """Run named reads in one transaction under the dashboard's statement timeout, on
        the read replica when the client has one."""
        timeout = ("web_statement_timeout", {"ms": str(self.web_timeout_ms)})
        return (await self._read_together([timeout, *reads], tolerant=tolerant))[1:]

    async def web_overview(self) -> tuple[list[QueueStats], list[Pause]]:
        """Per-queue counts (those of ``queue_stats``, read from partial indexes only; at
        most 1000 queues) and the pauses in force."""
        stats, pauses = await self._web_rows([("web_queue_stats", None), ("list_pauses", None)])
        return [stats_from_row(r) for r in stats], pauses_from_rows(pauses)

    async def web_waiting(self) -> dict[str, int]:
        """Jobs waiting on dependencies, per queue (at most 1000 queues)."""
        (rows,) = await self._web_rows([("web_waiting_counts", None)])
        return {str(queue): int(count) for queue, count in rows}

    async def web_suspended(self) -> dict[str, int]:
        """Suspended jobs (sleeping, waiting for a signal or for children), per queue."""
        (rows,) = await self._web_rows([("suspended_stats", None)])
        counts: dict[str, int] = {}
        for queue, _reason, count, _overdue in rows:
            counts[str(queue)] = counts.get(str(queue), 0) + int(count)
        return counts

    async def web_throughput(self, window: int = THROUGHPUT_WINDOW) -> dict[str, list[int]]:
        """Jobs finished per queue in each of the last 60 minutes, oldest minute first,
        counted among the newest ``window`` jobs (capped: no scan of all history)."""
        params = {"window": validate.check_int("window", window, 1, 10_000_000)}
        (rows,) = await self._web_rows([("web_throughput", params)])
        series: dict[str, list[int]] = {}
        for queue, minute, count in rows:
            series.setdefault(queue, [0] * 60)[59 - int(minute)] += int(count)
        return series

    async def web_jobs(
        self,
        *,
        statuses: list[str] | None = None,
        queue: str | None = None,
        task: str | None = None,
        error_code: str | None = None,
        ordering_key: str | None = None,
        unique_key: str | None = None,
        payload: str | None = None,
        before: int | None = None,
        created_after: dt.datetime | None = None,
        created_before: dt.datetime | None = None,
        limit: int = 50,
    ) -> list[Job]:
        """One page of the job list, newest first; ``before`` is the previous page's last
        id (keyset pagination). ``payload`` is JSON text matched with ``@>``;
        ``created_after``/``created_before`` bound the creation time (aware datetimes)."""
        params = {
            "statuses": statuses,
            "queue": queue,
            "task": task,
            "error_code": error_code,
            "ordering_key": ordering_key,
            "unique_key": unique_key,
            "payload": payload,
            "before": before,
            "created_after": created_after,
            "created_before": created_before,
            "limit": validate.check_int("limit", limit, 1, 500),
        }
        (rows,) = await self._web_rows([("web_jobs", params)], tolerant=True)
        return [job_from_row(r) for r in rows]

    async def web_dead(
        self,
        *,
        limit: int = 50,
        cap: int = 10_000,
        before: int | None = None,
        **filters: Unpack[JobFilter],
    ) -> tuple[list[Job], int]:
        """Dead jobs matching the operator filter (newest first; ``before``: the previous
        page's last id) and how many match, counted up to ``cap`` (the dry run of a bulk
        replay or purge)."""
        params = job_filter(["dead"], **filters)
        page = {
            **params,
            "limit": validate.check_int("limit", limit, 1, 500),
            "before": None
            if before is None
            else validate.check_int("before", before, 1, 2**63 - 1),
        }
        listed, counted = await self._web_rows(
            [
                ("web_dead_jobs", page),
                ("web_count_dead", {**params, "cap": validate.check_int("cap", cap, 1, 10**7)}),
            ],
            tolerant=True,
        )
        return [job_from_row(r) for r in listed], int(counted[0][0])

    async def web_job(
        self, job_id: int
    ) -> tuple[Job, list[JobEvent], list[EffectRecord], UniqueKeyHolder | None, JobFlags] | None:
        """One job with its whole trail, effects, unique key holder and its ordering key,
        waiting and blocked flags."""
        params = {"id": validate.check_int("job id", job_id, 1, 2**63 - 1)}
        job, events, effects, unique, ordering = await self._web_rows(
            [
                ("get_job", params),
                ("job_events", params),
                ("job_effects", params),
                ("unique_key_of_job", params),
                ("web_job_ordering_key", params),
            ],
            tolerant=True,
        )
        if not job:
            return None
        holder = UniqueKeyHolder(*unique[0]) if unique and unique[0][0] is not None else None
        return (
            job_from_row(job[0]),
            [event_from_row(r) for r in events],
            [effect_from_row(r) for r in effects],
            holder,
            JobFlags(*ordering[0]) if ordering else JobFlags(None, False, False),
        )

    async def web_job_durable(
        self, job_id: int
    ) -> tuple[list[StepRecord], list[tuple[str, Any, Any, str | None]]]:
        """A job's durable execution for its page: its step records in their order (the
        timeline) and the signals sent to it (values as stored: sealed ones stay so)."""
        params = {"id": validate.check_int("job id", job_id, 1, 2**63 - 1)}
        steps, signals = await self._web_rows(
            [("job_steps", params), ("job_signals", params)], tolerant=True
        )
        return [StepRecord(*r) for r in steps], [(r[0], r[1], r[2], r[3]) for r in signals]

    async def web_blocked_keys(self, *, limit: int = 100) -> list[BlockedKey]:
        """Ordering keys held up by a dead head, oldest first."""
        params = {"limit": validate.check_int("limit", limit, 1, 1000)}
        (rows,) = await self._web_rows([("blocked_keys", params)])
        return [BlockedKey(*r) for r in rows]

    async def web_autoscaling(self, queue: str | None = None) -> list[QueueScaling]:
        """The autoscaling signal (``autoscaling()``) under the dashboard's timeout."""
        if queue is not None:
            validate.check_name("queue", queue)
        (rows,) = await self._web_rows([("autoscaling", {"queue": queue})])
        return [QueueScaling(*row) for row in rows]

    async def web_pauses(self) -> list[Pause]:
        (rows,) = await self._web_rows([("list_pauses", None)])
        return pauses_from_rows(rows)

    async def web_limits(self) -> list[Limit]:
        """Every limit with its slots in use and jobs waiting (``limits()``), under the
        dashboard's statement timeout."""
        (rows,) = await self._web_rows([("list_limits", {})])
        return [limit_from_row(r) for r in rows]

    async def web_fair_keys(self, queue: str, *, limit: int = TOP_KEYS) -> list[FairKey]:
        """A fair queue's keys with the largest backlogs (``fair_keys()``), under the
        dashboard's statement timeout: a key's backlog is a count of its pending jobs."""
        params = {
            "queue": validate.check_name("queue", queue),
            "limit": validate.check_int("limit", limit, 1, 10_000),
        }
        (rows,) = await self._web_rows([("fair_keys", params)])
        return fair_keys_from_rows(rows)

    async def web_workers(self) -> list[WorkerLeases]:
        """Who holds leases now, per lease owner (at most 1000 owners)."""
        (rows,) = await self._web_rows([("web_workers", None)])
        return [WorkerLeases(str(r[0]), int(r[1]), r[2], r[3], int(r[4]), list(r[5])) for r in rows]

    async def web_tasks(
        self, *, seconds: float = 3600.0, window: int = THROUGHPUT_WINDOW
    ) -> list[TaskStats]:
        """Per task, among the newest ``window`` jobs that finished in the last
        ``seconds``: successes, deaths, run time p50/p95/p99 of the successes and the
        failure rate (computed in SQL)."""
        params = {
            "seconds": float(validate.check_int("seconds", int(seconds), 1, 366 * 86400)),
            "window": validate.check_int("window", window, 1, 10_000_000),
        }
        (rows,) = await self._web_rows([("web_task_stats", params)])
        found = []
        for task, succeeded, dead, percentiles, rate in rows:
            p50, p95, p99 = percentiles if percentiles is not None else (None, None, None)
            found.append(
                TaskStats(str(task), int(succeeded), int(dead), p50, p95, p99, float(rate))
            )
        return found

    async def web_dead_groups(self, *, queue: str | None = None) -> list[DeadGroup]:
        """Dead jobs grouped by error code, the biggest groups first (at most 100)."""
        (rows,) = await self._web_rows([("web_dead_groups", {"queue": queue})])
        return [DeadGroup(r[0], int(r[1]), r[2], r[3], int(r[4])) for r in rows]

    async def web_suggestions(self, *, window: int = SUGGEST_WINDOW) -> tuple[list[str], list[str]]:
        """The task names and error codes among the newest ``window`` jobs (at most 200
        of each, sorted): the filters' autocomplete."""
        params = {"window": validate.check_int("window", window, 1, 1_000_000)}
        tasks, codes = await self._web_rows(
            [("web_task_names", params), ("web_error_codes", params)]
        )
        return [str(r[0]) for r in tasks], [str(r[0]) for r in codes]

    async def web_state_estimates(self) -> dict[str, int]:
        """The planner's estimate of how many jobs are in each state (history included)."""
        (rows,) = await self._web_rows([("web_state_estimates", None)])
        return {str(state): int(count) for state, count in rows}

    async def web_job_links(self, job_id: int) -> JobLinks:
        """The job's dependencies, dependents, batch and stored result."""
        params = {"id": validate.check_int("job id", job_id, 1, 2**63 - 1)}
        deps, dependents, batch_of, result = await self._web_rows(
            [
                ("job_dependencies", params),
                ("job_dependents", {**params, "limit": 100}),
                ("job_batch", params),
                ("job_result", params),
            ]
        )
        batch = None
        if batch_of and batch_of[0][0] is not None:
            (found,) = await self._web_rows([("get_batch", {"id": int(batch_of[0][0])})])
            batch = BatchInfo(*found[0]) if found else None
        return JobLinks(
            [Dependency(int(r[0]), r[1], r[2]) for r in deps],
            [Dependency(int(r[0]), r[1], r[2], bool(r[3])) for r in dependents],
            batch,
            JobResult(job_id, *result[0]) if result else None,
        )
