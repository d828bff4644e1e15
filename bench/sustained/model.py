"""The sustained run's data: its options, and what each sample reads (the jobs table's
statistics, a worker's /metrics, a snapshot of everything, the interval between two)."""

from __future__ import annotations

import pathlib
from dataclasses import dataclass

Buckets = tuple[tuple[float, float], ...]  # a cumulative histogram: (le, count), +Inf last
Sizes = tuple[tuple[str, int], ...]  # (relation, bytes): every table and index of the schema


@dataclass(frozen=True)
class TableStats:
    """The jobs table as the statistics collector sees it (lags by about a second)."""

    table_bytes: int
    index_bytes: int
    live_tuples: int
    dead_tuples: int
    autovacuums: int
    last_autovacuum: str | None
    autoanalyzes: int
    deleted_tuples: int  # rows deleted since the table was created: the prune's work
    sizes: Sizes  # pg_relation_size of each table (main fork) and each index, by name;
    # with each table's TOAST (heap and index) as "<table> (toast)"
    toast_bytes: int = 0  # the jobs table's TOAST: where inline payloads over ~2 KB go


@dataclass(frozen=True)
class PruneStats:
    """The prune statement as pg_stat_statements counts it, cumulative since the server
    started (only where the extension is loaded, e.g. on ``--own-server``)."""

    calls: int
    rows: int
    exec_ms: float


@dataclass(frozen=True)
class Scrape:
    """The two worker metrics a sample needs, from one /metrics response."""

    finished: float  # leaseq_jobs_finished_total, all queues and outcomes
    claim_buckets: Buckets


@dataclass(frozen=True)
class Snapshot:
    """Everything read at one sampling moment; an interval is the difference of two."""

    at: float  # time.monotonic() of the scrape
    offered: int  # jobs the producer had enqueued
    behind: int  # jobs the schedule wanted enqueued by now that were not (yet)
    finished: float  # summed over the workers
    claim_buckets: Buckets  # summed over the workers
    backlog: int  # pending jobs (ready + scheduled)
    running: int
    oldest_age: float  # seconds the oldest claimable job has waited
    table: TableStats
    prune: PruneStats | None
    rss: tuple[int, ...]  # bytes, one per worker


@dataclass(frozen=True)
class Interval:
    """One row of the output: the interval that ended ``t`` seconds into the run."""

    t: float
    seconds: float
    offered: int
    finished: int
    offered_per_s: float
    finished_per_s: float
    producer_behind: int
    backlog: int
    running: int
    oldest_age: float
    table: TableStats  # as sampled at the end of the interval
    pruned_per_s: float  # jobs rows deleted per second (n_tup_del): what retention removed
    prune_calls: int | None  # prune statements (batches) run; None without pg_stat_statements
    prune_ms_mean: float | None  # mean time of one prune statement in the interval
    prune_busy: float | None  # share of the interval's wall time spent in prune statements
    claims: int  # claim statements the workers ran in the interval
    claim_p50_ms: float | None
    claim_p99_ms: float | None
    rss_bytes: int  # summed over the workers
    rss_per_worker: tuple[int, ...]


@dataclass(frozen=True)
class Options:
    """The command line, checked; ``dsn`` already resolved (flag, env, embedded)."""

    dsn: str  # "" until --own-server has started its server
    minutes: float
    rate: float
    interval: float
    retention: str
    prune_interval: str
    concurrency: int
    batch: int
    workers: int
    own_server: bool
    out: pathlib.Path
    payload_bytes: int = 0  # 0: the payload is {"n": i}; else {"n": i, "data": N chars}
    offload_above: int | None = None  # the producer's App(offload_above=) (payloads table)

    @property
    def samples(self) -> int:
        return max(1, round(self.minutes * 60 / self.interval))
