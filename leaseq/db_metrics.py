"""Database metrics: what ``leaseq metrics serve`` exports about the queue itself.

Computed on each scrape by cheap indexed queries (``queue_stats``, ``database_health``, the
pauses, limits and the read replica's lag); names and meanings come from the one table in
``leaseq.metrics``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from leaseq.metrics import SPECS
from leaseq.models import QueueStats
from leaseq.rules.limits import Limit
from leaseq.rules.pauses import SCOPES, Pause


class DatabaseCollector(Collector):
    """Computes the database metrics on each scrape through ``fetch`` (a callable that runs
    the ``queue_stats`` and ``database_health`` statements; the pauses in force, when given,
    as ``extra["pauses"]``, the limits as ``extra["limits"]``, the read replica's
    :class:`~leaseq.rules.replicas.ReplicaLag` as ``extra["replica_lag"]``)."""

    def __init__(self, fetch: Callable[[], tuple[list[QueueStats], dict[str, Any]]]) -> None:
        self._fetch = fetch

    def describe(self) -> Iterable[Metric]:
        return []  # computed on demand; nothing to check at registration

    def collect(self) -> Iterator[Metric]:
        started = time.perf_counter()
        queues, extra = self._fetch()
        elapsed = time.perf_counter() - started

        def family(name: str) -> GaugeMetricFamily:
            spec = SPECS[name]
            return GaugeMetricFamily(name, spec.help, labels=list(spec.labels))

        oldest = family("leaseq_oldest_claimable_age_seconds")
        jobs = family("leaseq_jobs")
        near = family("leaseq_running_near_expiry")
        dead_age = family("leaseq_oldest_dead_age_seconds")
        for q in queues:
            oldest.add_metric([q.queue], q.oldest_ready_age)
            for state, value in (
                ("ready", q.ready),
                ("scheduled", q.scheduled),
                ("running", q.running),
                ("dead", q.dead),
            ):
                jobs.add_metric([q.queue, state], value)
            near.add_metric([q.queue], q.near_expiry)
            dead_age.add_metric([q.queue], q.oldest_dead_age)
        yield from (oldest, jobs, near, dead_age)
        expired = family("leaseq_expired_leases")
        expired.add_metric([], extra["expired_leases"])
        locks = family("leaseq_lock_waits")
        locks.add_metric([], extra["lock_waits"])
        conns = family("leaseq_db_connections")
        for app, count in sorted(extra["connections"].items()):
            conns.add_metric([app], count)
        yield from _pause_families(extra.get("pauses", []), family)
        lag = family("leaseq_schedule_lag_seconds")
        lag.add_metric([], extra.get("schedule_lag", 0.0))
        yield lag
        yield from _limit_families(extra.get("limits", []), family)
        waiting = family("leaseq_jobs_waiting_on_dependencies")
        waiting.add_metric([], extra.get("waiting_jobs", 0))
        oldest_wait = family("leaseq_oldest_dependency_wait_seconds")
        oldest_wait.add_metric([], extra.get("oldest_wait", 0.0))
        yield from (waiting, oldest_wait)
        yield from _suspended_families(extra.get("suspended", []), family)
        backlog, share = family("leaseq_fair_key_backlog"), family("leaseq_fair_key_share")
        for queue, key, n, part in extra.get("fair_keys", []):
            backlog.add_metric([queue, key], n)
            share.add_metric([queue, key], part)
        yield from (backlog, share)
        took = family("leaseq_metrics_query_seconds")
        took.add_metric([], elapsed)
        yield from (expired, locks, conns, took)
        if (replica := extra.get("replica_lag")) is not None:
            behind = family("leaseq_read_replica_lag_seconds")
            behind.add_metric([], math.nan if replica.seconds is None else replica.seconds)
            yield behind


def _suspended_families(
    suspended: list[tuple[str, str | None, int, float]],
    family: Callable[[str], GaugeMetricFamily],
) -> Iterator[Metric]:
    count = family("leaseq_jobs_suspended")
    overdue = family("leaseq_suspended_wakeup_overdue_seconds")
    late: dict[str, float] = {}
    for queue, reason, n, behind in suspended:
        count.add_metric([queue, reason or "unknown"], n)
        late[queue] = max(late.get(queue, 0.0), behind)
    for queue, behind in sorted(late.items()):
        overdue.add_metric([queue], behind)
    yield from (count, overdue)


def _pause_families(
    pauses: list[Pause], family: Callable[[str], GaugeMetricFamily]
) -> Iterator[Metric]:
    count, oldest, queues = (
        family("leaseq_pauses"),
        family("leaseq_oldest_pause_age_seconds"),
        family("leaseq_queue_paused"),
    )
    for scope in SCOPES:
        of_scope = [p for p in pauses if p.scope == scope]
        count.add_metric([scope], len(of_scope))
        oldest.add_metric([scope], max((p.paused_for for p in of_scope), default=0.0))
    for p in pauses:
        if p.scope == "queue":
            queues.add_metric([p.value], 1)
    yield from (count, oldest, queues)


def _limit_families(
    limits: list[Limit], family: Callable[[str], GaugeMetricFamily]
) -> Iterator[Metric]:
    conc, used, waiting, wait = (
        family("leaseq_limit_concurrency"),
        family("leaseq_limit_slots_in_use"),
        family("leaseq_limit_waiting_jobs"),
        family("leaseq_limit_rate_wait_seconds"),
    )
    for x in limits:
        if x.concurrency is not None:
            conc.add_metric([x.name], x.concurrency)
            used.add_metric([x.name], x.in_use)
        if x.waiting is not None:
            waiting.add_metric([x.name], x.waiting)
        if x.rate_wait is not None:
            wait.add_metric([x.name], x.rate_wait)
    yield from (conc, used, waiting, wait)


def database_registry(
    fetch: Callable[[], tuple[list[QueueStats], dict[str, Any]]],
) -> CollectorRegistry:
    """A registry holding only the database metrics, computed by ``fetch`` on each scrape."""
    registry = CollectorRegistry()
    registry.register(DatabaseCollector(fetch))
    return registry
