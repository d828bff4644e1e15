"""Metrics: one table of names and meanings, and the two places they come from.

Worker metrics describe what one worker process did (transitions, latencies, lost fences);
``leaseq worker --metrics-port`` serves them. Database metrics describe the queue itself
(ages, counts, dead jobs), computed on scrape by cheap indexed queries; ``leaseq metrics
serve`` serves them. Labels are bounded: queue names (a deployment's own, few), error codes
(at most ``MAX_ERROR_CODES`` distinct, the rest as "other"), attempt numbers (1-5, then
"6+"); never job ids.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
)
from prometheus_client.core import (
    CounterMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from leaseq.rules.unique import OUTCOMES

MAX_ERROR_CODES = 50
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)
STATEMENT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5)


@dataclass(frozen=True)
class MetricSpec:
    name: str
    kind: str  # counter, gauge, histogram
    labels: tuple[str, ...]
    source: str  # worker or database
    help: str


#: Every metric leaseq exports. docs/metrics.md is generated from this list by
#: tools/gen_docs.py (a unit test fails when the page is stale).
METRICS: tuple[MetricSpec, ...] = (
    # -- worker ------------------------------------------------------------------------
    MetricSpec(
        "leaseq_jobs_claimed_total",
        "counter",
        ("queue",),
        "worker",
        "Jobs claimed (each claim starts an attempt under a new fencing token).",
    ),
    MetricSpec(
        "leaseq_jobs_finished_total",
        "counter",
        ("queue", "outcome"),
        "worker",
        "Attempts whose outcome was committed: succeeded, retried, dead, cancelled.",
    ),
    MetricSpec(
        "leaseq_retries_total",
        "counter",
        ("queue", "error_code", "attempt"),
        "worker",
        "Failed attempts scheduled for retry, by error code and attempt number.",
    ),
    MetricSpec(
        "leaseq_unique_conflicts_total",
        "counter",
        ("outcome",),
        "client",
        "Enqueues that found their unique key held, by outcome (skip, replace, follow_up, "
        "raise); counted in the process that enqueued (a worker counts its app's clients; "
        "elsewhere register UniqueConflictCollector).",
    ),
    MetricSpec(
        "leaseq_claim_latency_seconds",
        "histogram",
        ("queue",),
        "worker",
        "Time from a job becoming available to its claim (database clock).",
    ),
    MetricSpec(
        "leaseq_completion_latency_seconds",
        "histogram",
        ("queue",),
        "worker",
        "Time from claim to the committed outcome of the attempt.",
    ),
    MetricSpec(
        "leaseq_claim_statement_seconds",
        "histogram",
        (),
        "worker",
        "Duration of one claim statement (round trip).",
    ),
    MetricSpec(
        "leaseq_lost_fence_total",
        "counter",
        ("operation",),
        "worker",
        "Fenced writes refused because the lease was gone: complete, fail, heartbeat.",
    ),
    MetricSpec(
        "leaseq_leases_lost_total",
        "counter",
        ("reason",),
        "worker",
        "Attempts the worker gave up: LEASE_LOST, NO_PROGRESS, MAX_RUNTIME_EXCEEDED, "
        "CANCELLED, WORKER_SHUTDOWN.",
    ),
    MetricSpec(
        "leaseq_heartbeat_failures_total",
        "counter",
        (),
        "worker",
        "Lease renewals that could not reach the database.",
    ),
    MetricSpec(
        "leaseq_lease_expirations_total",
        "counter",
        ("outcome",),
        "worker",
        "Expired leases this worker's sweeper recovered: requeued, dead or cancelled.",
    ),
    MetricSpec(
        "leaseq_jobs_expired_total",
        "counter",
        (),
        "worker",
        "Pending jobs this worker's sweeper ended unrun: their start deadline (expires=) "
        "passed (cancelled, EXPIRED).",
    ),
    MetricSpec(
        "leaseq_handler_stops_total",
        "counter",
        ("kind",),
        "worker",
        "Sync handlers the worker stopped: soft (an exception raised in the handler's "
        "thread), hard (the thread did not end within stop_grace: the process exits).",
    ),
    MetricSpec(
        "leaseq_late_starts_total",
        "counter",
        (),
        "worker",
        "Claimed jobs not started because their lease ended first (slow claim, paused "
        "worker); nothing was run or reported under them.",
    ),
    MetricSpec(
        "leaseq_claim_errors_total",
        "counter",
        ("queue",),
        "worker",
        "Claims that failed on bad data (a row the claim could not handle); the queue is "
        "backed off and the worker keeps running.",
    ),
    MetricSpec(
        "leaseq_schedule_ticks_total",
        "counter",
        ("outcome",),
        "worker",
        "Schedule ticks this worker's ticker handled: enqueued, or skipped by the catch-up "
        "or overlap policy.",
    ),
    MetricSpec(
        "leaseq_payload_objects_deleted_total",
        "counter",
        (),
        "worker",
        "Offloaded payload objects this worker deleted from the payload store after their "
        "jobs were pruned or purged (docs/payloads.md).",
    ),
    MetricSpec(
        "leaseq_payload_orphans_removed_total",
        "counter",
        (),
        "worker",
        "Offloaded payloads no job named (a job deleted by hand, an enqueue that died between "
        "its upload and its commit) that this worker's orphan sweep removed.",
    ),
    MetricSpec(
        "leaseq_fair_keys_pruned_total",
        "counter",
        (),
        "worker",
        "Keys of fair queues this worker's fair key pruner deleted: idle longer than "
        "fair_key_retention with no job left (docs/fairness.md).",
    ),
    MetricSpec(
        "leaseq_fair_keys_vacuums_total",
        "counter",
        (),
        "worker",
        "Vacuums of fair_keys this worker ran: each claim of a fair queue leaves dead pass "
        "entries that later claims step over until a vacuum (docs/fairness.md).",
    ),
    MetricSpec("leaseq_worker_slots", "gauge", (), "worker", "Handler slots (concurrency)."),
    MetricSpec(
        "leaseq_worker_busy_slots",
        "gauge",
        (),
        "worker",
        "Slots running a handler now; busy / slots is the saturation.",
    ),
    MetricSpec(
        "leaseq_worker_held_leases",
        "gauge",
        (),
        "worker",
        "Leases this worker holds (running, prefetched, or being reported).",
    ),
    MetricSpec(
        "leaseq_worker_db_connections",
        "gauge",
        ("state",),
        "worker",
        "The worker's pooled connections: in_use, idle; waiting requests.",
    ),
    MetricSpec(
        "leaseq_database_up",
        "gauge",
        (),
        "worker",
        "1 while the worker reaches the database, 0 during an outage.",
    ),
    # -- database ------------------------------------------------------------------------
    MetricSpec(
        "leaseq_oldest_claimable_age_seconds",
        "gauge",
        ("queue",),
        "database",
        "Age of the oldest job that is claimable now (0 when none): alert on old work.",
    ),
    MetricSpec(
        "leaseq_jobs",
        "gauge",
        ("queue", "state"),
        "database",
        "Jobs by state: ready, scheduled, running, dead.",
    ),
    MetricSpec(
        "leaseq_running_near_expiry",
        "gauge",
        ("queue",),
        "database",
        "Running jobs whose lease ends within 10 seconds.",
    ),
    MetricSpec(
        "leaseq_expired_leases",
        "gauge",
        (),
        "database",
        "Running jobs whose lease already ended, waiting for a sweep.",
    ),
    MetricSpec(
        "leaseq_oldest_dead_age_seconds",
        "gauge",
        ("queue",),
        "database",
        "Age of the oldest unresolved dead job (0 when none).",
    ),
    MetricSpec(
        "leaseq_pauses",
        "gauge",
        ("scope",),
        "database",
        "Pauses in force by scope (queue, task, ordering_key); their claims are not made.",
    ),
    MetricSpec(
        "leaseq_oldest_pause_age_seconds",
        "gauge",
        ("scope",),
        "database",
        "How long the oldest pause of each scope has stood (0 when none).",
    ),
    MetricSpec(
        "leaseq_queue_paused",
        "gauge",
        ("queue",),
        "database",
        "1 for each paused queue (absent otherwise): its jobs wait on purpose.",
    ),
    MetricSpec(
        "leaseq_limit_concurrency",
        "gauge",
        ("limit",),
        "database",
        "The concurrency of each limit that has one (queue:, task:, key: or a key family).",
    ),
    MetricSpec(
        "leaseq_limit_slots_in_use",
        "gauge",
        ("limit",),
        "database",
        "Slots of each concurrency limit held by running jobs (a family: over its keys that "
        "have no limit of their own).",
    ),
    MetricSpec(
        "leaseq_limit_waiting_jobs",
        "gauge",
        ("limit",),
        "database",
        "Claimable jobs under each limit (a family: of its keys that have no limit of their "
        "own) that are still pending: held back while its slots are in use or its rate admits "
        "no more.",
    ),
    MetricSpec(
        "leaseq_limit_rate_wait_seconds",
        "gauge",
        ("limit",),
        "database",
        "Seconds until each rate limit admits one more claim (0: now); above 0 while the "
        "rate refuses claims.",
    ),
    MetricSpec(
        "leaseq_lock_waits",
        "gauge",
        (),
        "database",
        "leaseq connections waiting on a lock right now.",
    ),
    MetricSpec(
        "leaseq_db_connections",
        "gauge",
        ("application",),
        "database",
        "Open database connections of leaseq processes, by application_name.",
    ),
    MetricSpec(
        "leaseq_schedule_lag_seconds",
        "gauge",
        (),
        "database",
        "How far the most overdue enabled schedule is past its next tick (0 when none is).",
    ),
    MetricSpec(
        "leaseq_jobs_waiting_on_dependencies",
        "gauge",
        (),
        "database",
        "Jobs waiting for dependencies to end (pending, outside the claim index).",
    ),
    MetricSpec(
        "leaseq_oldest_dependency_wait_seconds",
        "gauge",
        (),
        "database",
        "How long the oldest job waiting on dependencies has waited (0 when none does).",
    ),
    MetricSpec(
        "leaseq_fair_key_backlog",
        "gauge",
        ("queue", "key"),
        "database",
        "Pending jobs of a fair queue's key (docs/fairness.md; key '': its jobs without a "
        "key), the 20 largest backlogs of each fair queue only.",
    ),
    MetricSpec(
        "leaseq_fair_key_share",
        "gauge",
        ("queue", "key"),
        "database",
        "A fair queue's key's expected share of the claims while its keys with a backlog keep "
        "one: its weight over theirs (the same 20 keys as leaseq_fair_key_backlog).",
    ),
    MetricSpec(
        "leaseq_jobs_suspended",
        "gauge",
        ("queue", "reason"),
        "database",
        "Suspended jobs (ctx.sleep: reason sleep; ctx.wait_for: reason signal), holding no "
        "lease or slot.",
    ),
    MetricSpec(
        "leaseq_suspended_wakeup_overdue_seconds",
        "gauge",
        ("queue",),
        "database",
        "How late the most overdue wake-up of a suspended job is (0 when none is due): it "
        "grows when no worker claims the queue.",
    ),
    MetricSpec(
        "leaseq_metrics_query_seconds",
        "gauge",
        (),
        "database",
        "How long computing these database metrics took.",
    ),
    MetricSpec(
        "leaseq_read_replica_lag_seconds",
        "gauge",
        (),
        "database",
        "With --read-dsn: how stale the read replica's answers may be (0 when it has "
        "replayed all the primary flushed; NaN when unknown; absent without a replica).",
    ),
)

SPECS = {spec.name: spec for spec in METRICS}


def exported_names() -> set[str]:
    """Names as they appear in the exposition (histograms add _bucket/_sum/_count)."""
    names = set()
    for spec in METRICS:
        names.add(spec.name)
        if spec.kind == "histogram":
            names |= {f"{spec.name}_bucket", f"{spec.name}_sum", f"{spec.name}_count"}
    return names


def _attempt_label(attempt: int) -> str:
    return str(attempt) if attempt <= 5 else "6+"


class LoopHistogram(Collector):
    """A labelled histogram for what the worker records on every job, updated from its
    event loop only: an observation is a bisect and two additions, with no lock and no
    label check. prometheus_client's Histogram costs about a microsecond an observation,
    and three per-job metrics cost a no-op job 8% of its throughput (python -m bench).
    Scrapes (another thread) read a copy of each series; a scrape may see a count and a
    sum one observation apart, never buckets out of order."""

    def __init__(
        self, name: str, documentation: str, labelnames: tuple[str, ...], buckets: tuple[float, ...]
    ) -> None:
        self.name, self._doc, self._labelnames = name, documentation, labelnames
        self._bounds = [float(b) for b in buckets]
        self._series: dict[tuple[str, ...], _Buckets] = {}

    def labels(self, *values: str) -> _Buckets:
        series = self._series.get(values)
        if series is None:
            series = self._series[values] = _Buckets(self._bounds)
        return series

    def describe(self) -> Iterable[Metric]:
        return [HistogramMetricFamily(self.name, self._doc, labels=self._labelnames)]

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(self.name, self._doc, labels=self._labelnames)
        for values, series in list(self._series.items()):
            counts, total = list(series.counts), series.sum
            cumulative, running = [], 0
            for bound, count in zip([*self._bounds, math.inf], counts, strict=True):
                running += count
                cumulative.append((_bucket_label(bound), running))
            family.add_metric(list(values), cumulative, total)
        yield family


class _Buckets:
    __slots__ = ("_bounds", "counts", "sum")

    def __init__(self, bounds: list[float]) -> None:
        self._bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last one is +Inf
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self._bounds, value)] += 1
        self.sum += value


def _bucket_label(bound: float) -> str:
    label: str = floatToGoString(bound)  # type: ignore[no-untyped-call]  # as its histograms do
    return label


class LoopCounter(Collector):
    """A labelled counter for per-job events, on the same terms as :class:`LoopHistogram`."""

    def __init__(self, name: str, documentation: str, labelnames: tuple[str, ...]) -> None:
        self.name = name.removesuffix("_total")
        self._doc, self._labelnames = documentation, labelnames
        self._values: dict[tuple[str, ...], float] = {}

    def inc(self, *values: str, amount: float = 1) -> None:
        self._values[values] = self._values.get(values, 0) + amount

    def describe(self) -> Iterable[Metric]:
        return [CounterMetricFamily(self.name, self._doc, labels=self._labelnames)]

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(self.name, self._doc, labels=self._labelnames)
        for values, value in list(self._values.items()):
            family.add_metric(list(values), value)
        yield family


class UniqueConflictCollector(Collector):
    """``leaseq_unique_conflicts_total`` from ``counts()`` (e.g. a client's
    ``unique_conflicts``, or ``App.unique_conflicts``): counted where the enqueue ran."""

    def __init__(self, counts: Callable[[], Mapping[str, int]]) -> None:
        self._counts = counts
        self._spec = SPECS["leaseq_unique_conflicts_total"]

    def describe(self) -> Iterable[Metric]:
        return [CounterMetricFamily(self._spec.name, self._spec.help, labels=self._spec.labels)]

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(self._spec.name, self._spec.help, labels=self._spec.labels)
        counts = self._counts()
        for outcome in OUTCOMES:
            family.add_metric([outcome], counts.get(outcome, 0))
        yield family


class WorkerMetrics:
    """The worker-side metrics of one worker, in a registry of their own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._codes: set[str] = set()

        def make(name: str, **kwargs: Any) -> Any:
            spec = SPECS[name]
            cls = {"counter": Counter, "gauge": Gauge, "histogram": Histogram}[spec.kind]
            # prometheus_client adds _total itself for counters.
            base = name.removesuffix("_total") if spec.kind == "counter" else name
            return cls(base, spec.help, spec.labels, registry=self.registry, **kwargs)

        self.claimed = make("leaseq_jobs_claimed_total")

        def on_loop(name: str, **kwargs: Any) -> Any:
            spec = SPECS[name]
            metric: Collector
            if spec.kind == "histogram":
                metric = LoopHistogram(name, spec.help, spec.labels, **kwargs)
            else:
                metric = LoopCounter(name, spec.help, spec.labels)
            self.registry.register(metric)
            return metric

        # Recorded for every job, from the event loop: the cheap kind (see LoopHistogram).
        self.finished = on_loop("leaseq_jobs_finished_total")
        self.retries = make("leaseq_retries_total")
        self.claim_latency = on_loop("leaseq_claim_latency_seconds", buckets=LATENCY_BUCKETS)
        self.completion_latency = on_loop(
            "leaseq_completion_latency_seconds", buckets=LATENCY_BUCKETS
        )
        self.claim_statement = make("leaseq_claim_statement_seconds", buckets=STATEMENT_BUCKETS)
        self.lost_fence = make("leaseq_lost_fence_total")
        self.leases_lost = make("leaseq_leases_lost_total")
        self.heartbeat_failures = make("leaseq_heartbeat_failures_total")
        self.lease_expirations = make("leaseq_lease_expirations_total")
        self.jobs_expired = make("leaseq_jobs_expired_total")
        self.late_starts = make("leaseq_late_starts_total")
        self.handler_stops = make("leaseq_handler_stops_total")
        self.claim_errors = make("leaseq_claim_errors_total")
        self.schedule_ticks = make("leaseq_schedule_ticks_total")
        self.payload_objects_deleted = make("leaseq_payload_objects_deleted_total")
        self.payload_orphans_removed = make("leaseq_payload_orphans_removed_total")
        self.fair_keys_pruned = make("leaseq_fair_keys_pruned_total")
        self.fair_keys_vacuums = make("leaseq_fair_keys_vacuums_total")
        self.slots = make("leaseq_worker_slots")
        self.busy_slots = make("leaseq_worker_busy_slots")
        self.held_leases = make("leaseq_worker_held_leases")
        self.db_connections = make("leaseq_worker_db_connections")
        self.database_up = make("leaseq_database_up")
        self.database_up.set(1)

    def error_code(self, code: str) -> str:
        if code in self._codes:
            return code
        if len(self._codes) < MAX_ERROR_CODES:
            self._codes.add(code)
            return code
        return "other"

    def retry(self, queue: str, code: str, attempt: int) -> None:
        self.retries.labels(queue, self.error_code(code), _attempt_label(attempt)).inc()
