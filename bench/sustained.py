"""Sustained run: leaseq at a fixed offered load for minutes, watching for decay.

The drains of ``python -m bench`` last seconds, on a fresh table. A queue that is fast
for seconds can still slow down over minutes: finished rows pile up until retention
prunes them, dead tuples and index bloat grow until autovacuum catches up, and the worker
process may grow. This run keeps a real ``leaseq worker`` busy at a fixed offered load
(``--rate`` jobs/s, enqueued by this process on a fixed schedule) for ``--minutes``, and
every ``--interval`` seconds samples throughput, backlog, the jobs table's size, its dead
tuples and autovacuum runs, the worker's claim-statement latency and its memory.

It is a measurement: nothing passes or fails on timing. It exits non-zero (one line on
stderr) only when the worker dies or the database cannot be reached.

Usage: ``python -m bench.sustained [--minutes 10] [--rate 5000] [--interval 30]``;
see bench/README.md.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as dt
import json
import math
import os
import pathlib
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from types import FrameType
from typing import Any, TypeVar

import psycopg
from prometheus_client.parser import text_string_to_metric_families

import leaseq
from bench.run import (
    QUEUE,
    REPO_ROOT,
    TASK,
    BenchError,
    Settings,
    _table,
    connect,
    fresh_schema,
    git_revision,
    leaseq_root,
    ms,
    percentile,
    resolve_bench_dsn,
    server_info,
    worker_command,
    worker_env,
)
from leaseq import validate
from leaseq.dsn import describe_dsn
from leaseq.errors import ConfigError, DatabaseUnavailable, LeaseqError

DEFAULT_OUT = REPO_ROOT / "bench" / "results" / "sustained.json"
TICK = 0.1  # seconds between two enqueue_many calls of the producer
CATCH_UP_TICKS = 10  # a late producer sends at most this many ticks' jobs in one call
READY_TIMEOUT = 60.0  # longest wait for a new worker's /readyz
STOP_TIMEOUT = 60.0  # longest wait for a worker after SIGTERM (its --shutdown-timeout is 30)
SCRAPE_TIMEOUT = 5.0
MB = 1024 * 1024
FINISHED = "leaseq_jobs_finished_total"
CLAIM_BUCKET = "leaseq_claim_statement_seconds_bucket"

N = TypeVar("N", int, float)
Buckets = tuple[tuple[float, float], ...]  # a cumulative histogram: (le, count), +Inf last

# One statement, autocommit: a new transaction per sample, so the statistics snapshot is
# never a cached one (stats_fetch_consistency). The counters themselves still lag: backends
# flush theirs at most about once a second, so the figures trail the table by ~1 s.
TABLE_STATS = """
SELECT pg_relation_size(relid), pg_indexes_size(relid), n_live_tup, n_dead_tup,
       autovacuum_count, last_autovacuum, autoanalyze_count, n_tup_del
FROM pg_stat_user_tables WHERE schemaname = %s AND relname = 'jobs'
"""


class WorkerDied(BenchError):
    """A worker process exited while the run needed it."""


class Stop(KeyboardInterrupt):
    """SIGTERM to this process: stop as cleanly as on Ctrl-C."""


# -- what is sampled --------------------------------------------------------------------


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
    claims: int  # claim statements the workers ran in the interval
    claim_p50_ms: float | None
    claim_p99_ms: float | None
    rss_bytes: int  # summed over the workers
    rss_per_worker: tuple[int, ...]


@dataclass(frozen=True)
class Options:
    """The command line, checked; ``dsn`` already resolved (flag, env, embedded)."""

    dsn: str
    minutes: float
    rate: float
    interval: float
    retention: str
    prune_interval: str
    concurrency: int
    batch: int
    workers: int
    out: pathlib.Path

    @property
    def samples(self) -> int:
        return max(1, round(self.minutes * 60 / self.interval))


# -- the producer -----------------------------------------------------------------------


class Producer(threading.Thread):
    """Offers ``rate`` jobs/s with ``Client.enqueue_many``, one call per TICK, on a fixed
    schedule. When a call returns late, the next one sends what the schedule still owes
    (up to CATCH_UP_TICKS' worth), so the load is not silently lowered; ``behind()`` says
    how far the producer trails the schedule, and each sample reports it."""

    def __init__(self, client: leaseq.Client, rate: float) -> None:
        super().__init__(name="sustained-producer", daemon=True)
        self.client = client
        self.rate = rate
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
                        leaseq.JobSpec(TASK, {"n": first + i}, queue=QUEUE) for i in range(count)
                    )
                    self.offered += count
                ticks = math.floor((now - self.started_at) / TICK) + 1
        except BaseException as exc:  # re-raised in the main thread by check()
            self.error = exc

    def check(self) -> None:
        """Raise, in the caller's thread, what stopped the producer."""
        if self.error is not None:
            raise self.error

    def stop(self) -> None:
        self._halt.set()
        if self.ident is not None:
            self.join()


@contextlib.contextmanager
def producing(client: leaseq.Client, rate: float) -> Iterator[Producer]:
    """A started producer, stopped (and joined) on the way out, whatever happened."""
    producer = Producer(client, rate)
    try:
        producer.start()
        yield producer
    finally:
        producer.stop()


# -- the workers ------------------------------------------------------------------------


@dataclass
class Worker:
    """One ``leaseq worker`` subprocess, its metrics port and the file it logs to."""

    proc: subprocess.Popen[bytes]
    port: int
    log_path: pathlib.Path
    exit_code: int | None = None

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def check_alive(self) -> None:
        code = self.proc.poll()
        if code is not None:
            raise WorkerDied(f"worker {self.proc.pid} exited with {code}: {self.last_words()}")

    def last_words(self) -> str:
        """The last line the worker wrote: why it stopped, on one line."""
        try:
            lines = self.log_path.read_text(errors="replace").strip().splitlines()
        except OSError:
            return "(no log)"
        return lines[-1].strip() if lines else "(no output)"


def free_ports(count: int) -> list[int]:
    """Ports nothing listens on now: all are held open together so they differ."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(count)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in socks]


def start_worker(settings: Settings, schema: str, opts: Options, port: int, log_dir: str) -> Worker:
    """A long-running (not --burst) worker serving /metrics on ``port``. It gets a process
    group of its own, so a Ctrl-C in the terminal reaches only this process, which then
    stops the worker with one SIGTERM (a second signal would make it abandon its jobs)."""
    command = worker_command(
        "--concurrency",
        str(opts.concurrency),
        "--batch-size",
        str(opts.batch),
        "--retention",
        opts.retention,
        "--prune-interval",
        opts.prune_interval,
        "--metrics-port",
        str(port),
    )
    log_path = pathlib.Path(log_dir) / f"worker-{port}.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            command,
            cwd=REPO_ROOT,
            env=worker_env(settings, schema),
            stdout=log,
            stderr=subprocess.STDOUT,
            process_group=0,
        )
    return Worker(proc, port, log_path)


def wait_ready(worker: Worker) -> None:
    """Until the worker's /readyz answers 200 (it is up and reaches the database)."""
    deadline = time.monotonic() + READY_TIMEOUT
    while time.monotonic() < deadline:
        worker.check_alive()
        try:
            with urllib.request.urlopen(worker.url("/readyz"), timeout=SCRAPE_TIMEOUT) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.2)
    raise BenchError(f"worker {worker.proc.pid} was not ready within {READY_TIMEOUT:g} s")


def stop_workers(workers: Sequence[Worker]) -> None:
    """SIGTERM (a graceful stop), then wait; a worker still there after STOP_TIMEOUT, or
    when waiting is interrupted, is killed, so none outlives the run."""
    try:
        for w in workers:
            if w.proc.poll() is None:
                w.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT
        for w in workers:
            with contextlib.suppress(subprocess.TimeoutExpired):
                w.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
    finally:
        for w in workers:
            if w.proc.poll() is None:
                print(
                    f"sustained: worker {w.proc.pid} still running after SIGTERM, killed; "
                    f"its last output: {w.last_words()}",
                    file=sys.stderr,
                )
                w.proc.kill()
            w.exit_code = w.proc.wait()


@contextlib.contextmanager
def running_workers(
    settings: Settings, schema: str, opts: Options, log_dir: str, workers: list[Worker]
) -> Iterator[list[Worker]]:
    """``--workers`` ready worker processes, each on a metrics port of its own, appended
    to ``workers`` (so their exit codes outlive the block); stopped on the way out, also
    when starting one of them failed."""
    try:
        for port in free_ports(opts.workers):
            workers.append(start_worker(settings, schema, opts, port, log_dir))
        for w in workers:
            wait_ready(w)
        yield workers
    finally:
        stop_workers(workers)


def scrape(worker: Worker) -> Scrape:
    """The worker's finished-jobs counter and claim-statement histogram from /metrics:
    exact counts, kept by the worker, so sampling costs the database nothing."""
    try:
        with urllib.request.urlopen(worker.url("/metrics"), timeout=SCRAPE_TIMEOUT) as resp:
            text = resp.read().decode()
    except (urllib.error.URLError, OSError) as exc:
        worker.check_alive()
        raise BenchError(f"cannot scrape worker {worker.proc.pid}'s metrics: {exc}") from None
    finished = 0.0
    buckets: dict[float, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == FINISHED:
                finished += sample.value
            elif sample.name == CLAIM_BUCKET:
                bound = float(sample.labels["le"])
                buckets[bound] = buckets.get(bound, 0.0) + sample.value
    return Scrape(finished, tuple(sorted(buckets.items())))


def rss_bytes(pid: int) -> int:
    """Resident memory of ``pid`` (VmRSS in /proc/PID/status; 0 where there is none)."""
    try:
        for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


# -- sampling ---------------------------------------------------------------------------


def table_stats(conn: psycopg.Connection[Any], schema: str) -> TableStats:
    """Size, tuples and vacuum counters of the jobs table: what bloat would show in."""
    row = conn.execute(TABLE_STATS, (schema,)).fetchone()
    if row is None:
        raise BenchError(f"no statistics for {schema}.jobs")
    table, index, live, dead, autovac, last_autovac, autoanalyze, deleted = row
    return TableStats(
        table_bytes=int(table),
        index_bytes=int(index),
        live_tuples=int(live),
        dead_tuples=int(dead),
        autovacuums=int(autovac),
        last_autovacuum=None if last_autovac is None else last_autovac.isoformat(),
        autoanalyzes=int(autoanalyze),
        deleted_tuples=int(deleted),
    )


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
        claims=round(window[-1][1]) if window else 0,
        claim_p50_ms=None if p50 is None else ms(p50),
        claim_p99_ms=None if p99 is None else ms(p99),
        rss_bytes=sum(after.rss),
        rss_per_worker=after.rss,
    )


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def progress_line(iv: Interval) -> str:
    behind = f"  PRODUCER BEHIND by {iv.producer_behind:,} jobs" if iv.producer_behind else ""
    t = iv.table
    return (
        f"[{iv.t:5.0f}s] offered {iv.offered_per_s:,.0f}/s  finished {iv.finished_per_s:,.0f}/s"
        f"  backlog {iv.backlog:,} (oldest {iv.oldest_age:.1f}s)"
        f"  table {t.table_bytes / MB:.1f} MB  index {t.index_bytes / MB:.1f} MB"
        f"  live {t.live_tuples:,}  dead {t.dead_tuples:,}  autovacuums {t.autovacuums}"
        f"  claim p50/p99 {_ms(iv.claim_p50_ms)}/{_ms(iv.claim_p99_ms)} ms"
        f"  RSS {iv.rss_bytes / MB:.0f} MB{behind}"
    )


# -- the run ----------------------------------------------------------------------------


@dataclass
class Run:
    """What a run leaves behind, also when it is interrupted half-way."""

    intervals: list[Interval] = field(default_factory=list)
    workers: list[Worker] = field(default_factory=list)
    interrupted: bool = False


def bench_settings(opts: Options) -> Settings:
    """bench.run's helpers (fresh_schema, worker_env) take its Settings; of it they read
    the DSN. The drain-only fields have no meaning here."""
    return Settings(
        dsn=opts.dsn,
        jobs=0,
        batch=opts.batch,
        concurrency=opts.concurrency,
        single=0,
        repeat=1,
    )


def wait_until(deadline: float, workers: Sequence[Worker], producer: Producer) -> None:
    """Sleep until ``deadline``, checking each second that nothing has died, so a dead
    worker ends the run at once rather than at the next sample."""
    while (left := deadline - time.monotonic()) > 0:
        time.sleep(min(left, 1.0))
        producer.check()
        for w in workers:
            w.check_alive()


def run_sustained(opts: Options, run: Run) -> None:
    """A fresh schema, the workers, the producer; a snapshot at the start and one every
    interval. The contexts unwind in order: producer, workers (SIGTERM), schema."""
    settings = bench_settings(opts)
    with (
        tempfile.TemporaryDirectory(prefix="leaseq-sustained-") as log_dir,
        fresh_schema(settings, "sustained") as client,
        connect(opts.dsn) as conn,
        running_workers(settings, client.schema, opts, log_dir, run.workers) as workers,
    ):
        before = take_snapshot(conn, client, workers, None)
        with producing(client, opts.rate) as producer:
            started = producer.started_at
            before = dataclasses.replace(before, at=started)
            for i in range(1, opts.samples + 1):
                wait_until(started + i * opts.interval, workers, producer)
                producer.check()
                after = take_snapshot(conn, client, workers, producer)
                run.intervals.append(interval_between(before, after, started))
                print(progress_line(run.intervals[-1]), file=sys.stderr, flush=True)
                before = after


# -- the report -------------------------------------------------------------------------


def summarize(intervals: Sequence[Interval]) -> dict[str, Any]:
    """The decay figures: the first interval is the warm-up (the worker's pool filling,
    the table empty); the steady state is every interval after it. Its first and last
    intervals are compared, and sizes at its start (the end of the warm-up) and its end."""
    if len(intervals) < 2:
        return {"note": "fewer than 2 intervals: no steady state after the warm-up"}
    warm, steady = intervals[0], intervals[1:]
    first, last = steady[0], steady[-1]
    seconds = sum(iv.seconds for iv in steady)
    rates = [iv.finished_per_s for iv in steady]
    return {
        "warmup_seconds": warm.seconds,
        "steady_seconds": seconds,
        "offered_per_s": sum(iv.offered for iv in steady) / seconds,
        "finished_per_s": sum(iv.finished for iv in steady) / seconds,
        "finished_per_s_median": percentile(rates, 50),
        "finished_per_s_min": min(rates),
        "finished_per_s_max": max(rates),
        "finished_per_s_first": first.finished_per_s,
        "finished_per_s_last": last.finished_per_s,
        "throughput_last_over_first": last.finished_per_s / first.finished_per_s
        if first.finished_per_s
        else None,
        "backlog_start": warm.backlog,
        "backlog_end": last.backlog,
        "backlog_max": max(iv.backlog for iv in steady),
        "oldest_age_max": max(iv.oldest_age for iv in steady),
        "table_bytes_start": warm.table.table_bytes,
        "table_bytes_end": last.table.table_bytes,
        "index_bytes_start": warm.table.index_bytes,
        "index_bytes_end": last.table.index_bytes,
        "live_tuples_start": warm.table.live_tuples,
        "live_tuples_end": last.table.live_tuples,
        "dead_tuples_max": max(iv.table.dead_tuples for iv in intervals),
        "autovacuums": last.table.autovacuums,
        "autovacuums_steady": last.table.autovacuums - warm.table.autovacuums,
        "deleted_tuples": last.table.deleted_tuples,
        "claim_p99_ms_first": first.claim_p99_ms,
        "claim_p99_ms_last": last.claim_p99_ms,
        "rss_bytes_start": warm.rss_bytes,
        "rss_bytes_end": last.rss_bytes,
        "producer_behind_max": max(iv.producer_behind for iv in intervals),
    }


def interval_table(intervals: Sequence[Interval]) -> str:
    headers = [
        "time s",
        "offered/s",
        "finished/s",
        "backlog",
        "oldest s",
        "table MB",
        "index MB",
        "live rows",
        "dead tuples",
        "autovacuums",
        "claim p50 ms",
        "claim p99 ms",
        "RSS MB",
    ]
    rows = [
        [
            f"{iv.t:.0f}",
            f"{iv.offered_per_s:,.0f}",
            f"{iv.finished_per_s:,.0f}",
            f"{iv.backlog:,}",
            f"{iv.oldest_age:.1f}",
            f"{iv.table.table_bytes / MB:.1f}",
            f"{iv.table.index_bytes / MB:.1f}",
            f"{iv.table.live_tuples:,}",
            f"{iv.table.dead_tuples:,}",
            str(iv.table.autovacuums),
            _ms(iv.claim_p50_ms),
            _ms(iv.claim_p99_ms),
            f"{iv.rss_bytes / MB:.0f}",
        ]
        for iv in intervals
    ]
    return _table(headers, rows, right=set(range(len(headers))))


def _mb(n: int) -> str:
    return f"{n / MB:.1f} MB"


def summary_table(s: dict[str, Any]) -> str:
    if "note" in s:
        return str(s["note"])
    ratio = s["throughput_last_over_first"]
    rows = [
        [
            "finished/s, first / last steady interval",
            f"{s['finished_per_s_first']:,.0f} / {s['finished_per_s_last']:,.0f}",
        ],
        [
            "throughput ratio, last / first (no decay: ~1.00)",
            "-" if ratio is None else f"{ratio:.2f}",
        ],
        [
            "finished/s over the steady state: mean (min-max)",
            f"{s['finished_per_s']:,.0f} ({s['finished_per_s_min']:,.0f}-"
            f"{s['finished_per_s_max']:,.0f})",
        ],
        ["offered/s over the steady state", f"{s['offered_per_s']:,.0f}"],
        [
            "backlog, start -> end of steady state (max)",
            f"{s['backlog_start']:,} -> {s['backlog_end']:,} ({s['backlog_max']:,})",
        ],
        ["oldest claimable job, max", f"{s['oldest_age_max']:.1f} s"],
        [
            "table size, start -> end",
            f"{_mb(s['table_bytes_start'])} -> {_mb(s['table_bytes_end'])}",
        ],
        [
            "index size, start -> end",
            f"{_mb(s['index_bytes_start'])} -> {_mb(s['index_bytes_end'])}",
        ],
        ["live rows, start -> end", f"{s['live_tuples_start']:,} -> {s['live_tuples_end']:,}"],
        ["rows deleted (pruned) in the whole run", f"{s['deleted_tuples']:,}"],
        ["dead tuples, max", f"{s['dead_tuples_max']:,}"],
        [
            "autovacuum runs (in the steady state)",
            f"{s['autovacuums']} ({s['autovacuums_steady']})",
        ],
        [
            "claim statement p99, first -> last",
            f"{_ms(s['claim_p99_ms_first'])} -> {_ms(s['claim_p99_ms_last'])} ms",
        ],
        ["worker RSS, start -> end", f"{_mb(s['rss_bytes_start'])} -> {_mb(s['rss_bytes_end'])}"],
    ]
    if s["producer_behind_max"]:
        rows.append(["producer behind schedule, max", f"{s['producer_behind_max']:,} jobs"])
    return _table(["summary (after a warm-up interval)", "value"], rows, right={1})


def header(opts: Options, info: dict[str, Any]) -> str:
    return (
        f"leaseq sustained: {describe_dsn(opts.dsn)}, PostgreSQL {info['server_version']} "
        f"(fsync={info['fsync']}, synchronous_commit={info['synchronous_commit']}), "
        f"{os.cpu_count()} CPUs\n"
        f"minutes={opts.minutes:g} rate={opts.rate:g}/s interval={opts.interval:g}s "
        f"retention={opts.retention} prune-interval={opts.prune_interval} "
        f"concurrency={opts.concurrency} batch={opts.batch} "
        f"workers={opts.workers}"
    )


def results_json(opts: Options, info: dict[str, Any], run: Run) -> dict[str, Any]:
    return {
        "when": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "leaseq_version": leaseq.__version__,
        "leaseq_path": str(leaseq_root()),
        "git": git_revision(),
        "python": platform.python_version(),
        "psycopg": psycopg.__version__,
        "cpus": os.cpu_count(),
        "database": describe_dsn(opts.dsn),
        "server": info,
        "settings": {
            "minutes": opts.minutes,
            "rate": opts.rate,
            "interval": opts.interval,
            "retention": opts.retention,
            "prune_interval": opts.prune_interval,
            "concurrency": opts.concurrency,
            "batch": opts.batch,
            "workers": opts.workers,
            "tick": TICK,
        },
        "interrupted": run.interrupted,
        "worker_exit_codes": [w.exit_code for w in run.workers],
        "intervals": [dataclasses.asdict(iv) for iv in run.intervals],
        "summary": summarize(run.intervals),
    }


def report(opts: Options, info: dict[str, Any], run: Run) -> None:
    """The table and the summary on stdout (progress went to stderr), and the JSON file."""
    print(header(opts, info))
    if run.interrupted:
        print(f"interrupted after {run.intervals[-1].t:.0f} s: the figures cover that part")
    print()
    print(interval_table(run.intervals))
    print()
    print(summary_table(summarize(run.intervals)))
    opts.out.parent.mkdir(parents=True, exist_ok=True)
    opts.out.write_text(json.dumps(results_json(opts, info, run), indent=2) + "\n")
    print(f"\nresults: {opts.out}")


# -- command line -----------------------------------------------------------------------


def _positive(kind: Callable[[str], N]) -> Callable[[str], N]:
    """An argparse type: ``kind(text)``, which must be above 0."""

    def parse(text: str) -> N:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be above 0, got {text}")
        return value

    return parse


def _retention(text: str) -> str:
    """Checked here, so a typo fails before the schema and the worker are set up."""
    return text if text == "never" else _duration(text)


def _duration(text: str) -> str:
    try:
        validate.parse_duration(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def parse_args(argv: Sequence[str] | None) -> Options:
    p = argparse.ArgumentParser(
        prog="python -m bench.sustained",
        description="leaseq at a fixed offered load for minutes: does throughput decay "
        "while the jobs table, its indexes and its dead tuples evolve?",
    )
    p.add_argument(
        "--dsn", default=None, help="PostgreSQL DSN (default: env LEASEQ_DSN, else embedded)"
    )
    p.add_argument("--minutes", type=_positive(float), default=10.0, help="run length")
    p.add_argument("--rate", type=_positive(float), default=5000.0, help="offered jobs/s")
    p.add_argument(
        "--interval", type=_positive(float), default=30.0, help="seconds between samples"
    )
    p.add_argument(
        "--retention",
        type=_retention,
        default="60s",
        help="the worker's --retention (default 60s, so the table can reach a steady size)",
    )
    p.add_argument(
        "--prune-interval",
        type=_duration,
        default="15s",
        help="the worker's --prune-interval (default 15s)",
    )
    p.add_argument("--concurrency", "-c", type=_positive(int), default=200)
    p.add_argument("--batch", "-b", type=_positive(int), default=100, help="--batch-size")
    p.add_argument("--workers", type=_positive(int), default=1, help="worker processes")
    p.add_argument(
        "--out",
        type=pathlib.Path,
        default=DEFAULT_OUT,
        help="JSON results file (default: bench/results/sustained.json)",
    )
    args = p.parse_args(argv)
    if args.interval > args.minutes * 60:
        p.error("--interval is longer than the run")
    return Options(
        dsn=resolve_bench_dsn(args.dsn),
        minutes=args.minutes,
        rate=args.rate,
        interval=args.interval,
        retention=args.retention,
        prune_interval=args.prune_interval,
        concurrency=args.concurrency,
        batch=args.batch,
        workers=args.workers,
        out=args.out,
    )


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise Stop


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def failure(exc: BaseException) -> int:
    """One line on stderr, exit status 1: a dead worker, an unreachable database."""
    if isinstance(exc, psycopg.OperationalError | DatabaseUnavailable):
        print(f"sustained: error: database unreachable: {_first_line(exc)}", file=sys.stderr)
    else:
        print(f"sustained: error: {_first_line(exc)}", file=sys.stderr)
    return 1


def main(argv: Sequence[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        opts = parse_args(argv)  # may start the embedded server
        info = server_info(opts.dsn)
    except KeyboardInterrupt:
        return 130
    except (LeaseqError, psycopg.Error) as exc:
        return failure(exc)
    print(header(opts, info), file=sys.stderr, flush=True)
    run = Run()
    try:
        run_sustained(opts, run)
    except KeyboardInterrupt:
        print("sustained: interrupted", file=sys.stderr)
        if not run.intervals:
            return 130
        run.interrupted = True
    except (BenchError, LeaseqError, psycopg.Error) as exc:
        return failure(exc)
    report(opts, info, run)
    return 130 if run.interrupted else 0


if __name__ == "__main__":
    sys.exit(main())
