"""Sampling in the sustained run: the producer that offers the fixed load, the snapshot
of workers and database at one moment, and the interval between two snapshots (with the
claim latency quantiles from the difference of two histogram scrapes)."""

from __future__ import annotations

import contextlib
import math
import secrets
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import psycopg

import leaseq
from bench.harness import QUEUE, TASK, BenchError, ms
from bench.sustained.model import Buckets, Interval, PruneStats, Snapshot, TableStats
from bench.sustained.workers import Worker, rss_bytes, scrape

TICK = 0.1  # seconds between two enqueue_many calls of the producer
CATCH_UP_TICKS = 10  # a late producer sends at most this many ticks' jobs in one call

# One statement, autocommit: a new transaction per sample, so the statistics snapshot is
# never a cached one (stats_fetch_consistency). The counters themselves still lag: backends
# flush theirs at most about once a second, so the figures trail the table by ~1 s.
TABLE_STATS = """
SELECT pg_relation_size(relid), pg_indexes_size(relid), n_live_tup, n_dead_tup,
       autovacuum_count, last_autovacuum, autoanalyze_count, n_tup_del,
       (SELECT coalesce(pg_total_relation_size(nullif(reltoastrelid, 0)), 0)
        FROM pg_class WHERE oid = relid)
FROM pg_stat_user_tables WHERE schemaname = %s AND relname = 'jobs'
"""
# Every table (main fork: its heap) and index of the schema, by name: which index bloats;
# and each table's TOAST table with its index, where values over ~2 KB are kept (1 MB
# payloads inline in jobs, or offloaded to payloads).
RELATION_SIZES = """
SELECT c.relname::text, pg_relation_size(c.oid)
FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace
WHERE n.nspname = %(schema)s AND c.relkind IN ('r', 'i')
UNION ALL
SELECT c.relname || ' (toast)', pg_total_relation_size(c.reltoastrelid)
FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace
WHERE n.nspname = %(schema)s AND c.relkind = 'r' AND c.reltoastrelid <> 0
ORDER BY 1
"""
# The worker's prune statement (leaseq's prune_finished: the one that deletes jobs whose
# finished_at is past the cut-off), summed over its entries in pg_stat_statements, which
# stores the text with its constants replaced by $n.
PRUNE_STATEMENT = """
SELECT count(*), coalesce(sum(calls), 0), coalesce(sum(rows), 0),
       coalesce(sum(total_exec_time), 0)
FROM pg_stat_statements
WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND query LIKE %s AND query LIKE %s
"""
PRUNE_PATTERNS = (
    "%DELETE FROM %.jobs AS j%",
    "%finished_at < now() - make_interval%",
)


# -- the producer -----------------------------------------------------------------------


class Producer(threading.Thread):
    """Offers ``rate`` jobs/s with ``Client.enqueue_many``, one call per TICK, on a fixed
    schedule. When a call returns late, the next one sends what the schedule still owes
    (up to CATCH_UP_TICKS' worth), so the load is not silently lowered; ``behind()`` says
    how far the producer trails the schedule, and each sample reports it."""

    def __init__(self, client: leaseq.Client, rate: float, payload_bytes: int = 0) -> None:
        super().__init__(name="sustained-producer", daemon=True)
        self.client = client
        self.rate = rate
        # Random text: real documents compress far less than repeated letters, which TOAST
        # would shrink to nothing. One text for every job: it is the size that matters.
        self.data = secrets.token_urlsafe(payload_bytes)[:payload_bytes] if payload_bytes else ""
        self.per_tick = max(1, round(rate * TICK))
        self.offered = 0
        self.started_at = 0.0
        self.error: BaseException | None = None
        self._halt = threading.Event()  # not _stop: threading.Thread has one

    def due(self, now: float) -> int:
        """Jobs the schedule has asked for by ``now``: one chunk per elapsed tick."""
        return round(self.rate * math.floor((now - self.started_at) / TICK) * TICK)

    def behind(self) -> int:
        """Owed jobs beyond the one chunk that may be on its way right now."""
        if not self.started_at:
            return 0
        return max(0, self.due(time.monotonic()) - self.offered - self.per_tick)

    def start(self) -> None:
        self.started_at = time.monotonic()
        super().start()

    def run(self) -> None:
        try:
            ticks = 0
            while not self._halt.wait(max(0.0, self.started_at + ticks * TICK - time.monotonic())):
                now = time.monotonic()
                count = min(self.due(now) - self.offered, self.per_tick * CATCH_UP_TICKS)
                if count > 0:
                    first = self.offered
                    self.client.enqueue_many(
                        leaseq.JobSpec(TASK, self.payload(first + i), queue=QUEUE)
                        for i in range(count)
                    )
                    self.offered += count
                ticks = math.floor((now - self.started_at) / TICK) + 1
        except BaseException as exc:  # re-raised in the main thread by check()
            self.error = exc

    def payload(self, n: int) -> dict[str, Any]:
        return {"n": n, "data": self.data} if self.data else {"n": n}

    def check(self) -> None:
        """Raise, in the caller's thread, what stopped the producer."""
        if self.error is not None:
            raise self.error

    def stop(self) -> None:
        self._halt.set()
        if self.ident is not None:
            self.join()


@contextlib.contextmanager
def producing(client: leaseq.Client, rate: float, payload_bytes: int = 0) -> Iterator[Producer]:
    """A started producer, stopped (and joined) on the way out, whatever happened."""
    producer = Producer(client, rate, payload_bytes)
    try:
        producer.start()
        yield producer
    finally:
        producer.stop()


# -- sampling ---------------------------------------------------------------------------


def table_stats(conn: psycopg.Connection[Any], schema: str) -> TableStats:
    """Size, tuples and vacuum counters of the jobs table: what bloat would show in."""
    row = conn.execute(TABLE_STATS, (schema,)).fetchone()
    if row is None:
        raise BenchError(f"no statistics for {schema}.jobs")
    table, index, live, dead, autovac, last_autovac, autoanalyze, deleted, toast = row
    found = conn.execute(RELATION_SIZES, {"schema": schema})
    sizes = tuple((str(name), int(size)) for name, size in found)
    return TableStats(
        table_bytes=int(table),
        index_bytes=int(index),
        live_tuples=int(live),
        dead_tuples=int(dead),
        autovacuums=int(autovac),
        last_autovacuum=None if last_autovac is None else last_autovac.isoformat(),
        autoanalyzes=int(autoanalyze),
        deleted_tuples=int(deleted),
        sizes=sizes,
        toast_bytes=int(toast),
    )


def has_statements(conn: psycopg.Connection[Any]) -> bool:
    """Whether pg_stat_statements can be read here (loaded and its view created)."""
    try:
        conn.execute("SELECT 1 FROM pg_stat_statements LIMIT 1")
    except psycopg.Error:
        return False
    return True


def prune_stats(conn: psycopg.Connection[Any]) -> PruneStats | None:
    """The prune statement's cumulative calls, rows and time; None before it first ran."""
    row = conn.execute(PRUNE_STATEMENT, PRUNE_PATTERNS).fetchone()
    if row is None or not row[0]:
        return None
    _, calls, rows, exec_ms = row
    return PruneStats(calls=int(calls), rows=int(rows), exec_ms=float(exec_ms))


def add_buckets(a: Buckets, b: Buckets) -> Buckets:
    """Two workers' histograms as one (their bucket bounds are the same constants)."""
    if not a:
        return b
    return tuple((bound, x + y) for (bound, x), (_, y) in zip(a, b, strict=True))


def take_snapshot(
    conn: psycopg.Connection[Any],
    client: leaseq.Client,
    workers: Sequence[Worker],
    producer: Producer | None,
    statements: bool = False,
) -> Snapshot:
    """Workers first (counter, histogram, memory), then the database. The producer's
    count is read at the scrape, so offered and finished cover the same moments."""
    for w in workers:
        w.check_alive()
    scrapes = [scrape(w) for w in workers]
    at = time.monotonic()
    offered = producer.offered if producer is not None else 0
    behind = producer.behind() if producer is not None else 0
    buckets: Buckets = ()
    for one in scrapes:
        buckets = add_buckets(buckets, one.claim_buckets)
    queues = [q for q in client.queue_stats() if q.queue == QUEUE]
    return Snapshot(
        at=at,
        offered=offered,
        behind=behind,
        finished=sum(one.finished for one in scrapes),
        claim_buckets=buckets,
        backlog=sum(q.ready + q.scheduled for q in queues),
        running=sum(q.running for q in queues),
        oldest_age=max((q.oldest_ready_age for q in queues), default=0.0),
        table=table_stats(conn, client.schema),
        prune=prune_stats(conn) if statements else None,
        rss=tuple(rss_bytes(w.proc.pid) for w in workers),
    )


def diff_buckets(after: Buckets, before: Buckets) -> Buckets:
    """Observations between two scrapes of a cumulative histogram, bucket by bucket."""
    if not before:
        return after
    return tuple((bound, b - a) for (bound, b), (_, a) in zip(after, before, strict=True))


def bucket_quantile(buckets: Sequence[tuple[float, float]], q: float) -> float | None:
    """The q-quantile of a cumulative histogram, as Prometheus' histogram_quantile does:
    linear within the bucket that holds it; the largest finite bound when it lies in +Inf.
    Only as exact as the bucket bounds (0.5, 1, 2.5, 5, 10, 25 ms, ...). None when empty."""
    total = buckets[-1][1] if buckets else 0.0
    if total <= 0:
        return None
    rank = q * total
    lower, below = 0.0, 0.0
    for bound, cumulative in buckets:
        if cumulative >= rank:
            if math.isinf(bound):
                return lower
            inside = cumulative - below
            return lower + (bound - lower) * ((rank - below) / inside if inside else 1.0)
        lower, below = bound, cumulative
    return lower


def interval_between(before: Snapshot, after: Snapshot, started: float) -> Interval:
    """The difference of two snapshots; the histogram difference gives this interval's
    claim latency, not the run's so far."""
    seconds = after.at - before.at
    offered = after.offered - before.offered
    finished = round(after.finished - before.finished)
    window = diff_buckets(after.claim_buckets, before.claim_buckets)
    p50, p99 = (bucket_quantile(window, q) for q in (0.50, 0.99))
    t = after.table
    calls = busy = mean = None
    if after.prune is not None:
        was = before.prune or PruneStats(0, 0, 0.0)
        calls = after.prune.calls - was.calls
        spent = after.prune.exec_ms - was.exec_ms
        busy = spent / 1000 / seconds
        mean = spent / calls if calls else None
    return Interval(
        t=after.at - started,
        seconds=seconds,
        offered=offered,
        finished=finished,
        offered_per_s=offered / seconds,
        finished_per_s=finished / seconds,
        producer_behind=after.behind,
        backlog=after.backlog,
        running=after.running,
        oldest_age=after.oldest_age,
        table=t,
        pruned_per_s=(t.deleted_tuples - before.table.deleted_tuples) / seconds,
        prune_calls=calls,
        prune_ms_mean=mean,
        prune_busy=busy,
        claims=round(window[-1][1]) if window else 0,
        claim_p50_ms=None if p50 is None else ms(p50),
        claim_p99_ms=None if p99 is None else ms(p99),
        rss_bytes=sum(after.rss),
        rss_per_worker=after.rss,
    )
