"""Side-by-side benchmark: leaseq against the raw-SQL limit, all in one run.

Every scenario runs ``--repeat`` times; the repeats are interleaved (round 1 of every
scenario, then round 2, ...) so that drift of the machine hits all scenarios alike. Each
sample gets a fresh schema, made with ``leaseq.Client(dsn, schema=...).migrate()`` and
dropped afterwards. Most figures are rates (jobs, claims or leases per second); some are
latencies (ms) or durations (s). Each is printed as the median and min-max over the
repeats. Ratios pair the samples of the same round and report the median and min-max of
those per-round ratios.

This prints figures and asserts nothing about time. It does check that each scenario
really did its work (every job drained, every lease swept, every old row pruned), since a
figure for work that was not done would be meaningless.

Usage: ``python -m bench [--dsn DSN] [--jobs N] [--batch B] [--repeat R] [--only NAME]``;
see bench/README.md.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as dt
import fnmatch
import importlib.metadata
import importlib.util
import json
import os
import pathlib
import platform
import random
import re
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import psycopg
from psycopg import sql

import leaseq
from leaseq.dsn import describe_dsn
from leaseq.sql import Queries

REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent
DEFAULT_OUT = pathlib.Path(__file__).resolve().parent / "results" / "latest.json"
WORKER_APP = "bench.apps:app"
TASK = "noop"  # the no-op task bench/apps.py registers
STAMP_TASK = "stamp"  # the task that records its start time (wake-latency)
QUEUE = "default"
ENQUEUE_CHUNK = 1000  # the chunk size of the "chunks" enqueue figures
PREP_CHUNK = 5000  # untimed enqueue_many chunks that fill the queue before a drain
CLAIM_LIMIT = 10  # LIMIT of the claim in claim-under-prune and claim-vs-backlog
PRUNE_AGE = 86400.0  # prune(older_than=...) in claim-under-prune; old rows are 10 days old
PRUNE_BATCH = 1000
WAKE_GAP = 0.020  # least seconds between a wake-latency job's start and the next enqueue
WAKE_POLL = 0.05  # --poll-interval of the polling-only wake-latency worker
WAKE_NOTIFY_POLL = 5.0  # --poll-interval of the NOTIFY wake-latency worker
WAKE_WARMUP = 3  # jobs run (and not counted) before the timed ones
WAKE_TIMEOUT = 15.0  # longest wait for one handler to start
DEFAULT_BACKLOGS = (10_000, 100_000, 1_000_000)
DEFAULT_PEER_JOBS = 2000  # procrastinate's N: it drains ~0.1-0.3k jobs/s on 2 cores
PEER_TIMEOUT = 600.0  # longest a peer's setup or drain subprocess may take
BENCH_EXTRA = "pip install -e '.[bench]'"

# "processed 10000 job(s) in 0.60s (16554/s): 10000 succeeded, 0 failed, 0 lost lease(s)"
WORKER_LINE = re.compile(
    r"processed (?P<jobs>\d+) job\(s\) in (?P<seconds>[0-9.]+)s \((?P<rate>[0-9.]+)/s\)"
    r": (?P<succeeded>\d+) succeeded, (?P<failed>\d+) failed, (?P<lost>\d+) lost"
)

# Rows written straight into {schema}.jobs with generate_series (untimed set-up that is
# much faster than enqueue_many for 10^5-10^6 rows). %s is the row count.
PENDING_ROWS: Final = """
INSERT INTO {} (queue_name, task, payload)
SELECT 'default', 'noop', jsonb_build_object('n', g) FROM generate_series(1, %s::int) AS g
"""
OLD_SUCCEEDED_ROWS: Final = """
INSERT INTO {} (queue_name, task, payload, status, attempt_count, lease_token,
                created_at, available_at, started_at, finished_at)
SELECT 'default', 'noop', jsonb_build_object('n', g), 'succeeded', 1, 1,
       now() - interval '10 days 2 minutes', now() - interval '10 days 2 minutes',
       now() - interval '10 days 1 minute', now() - interval '10 days'
FROM generate_series(1, %s::int) AS g
"""
EXPIRED_LEASE_ROWS: Final = """
INSERT INTO {} (queue_name, task, payload, status, attempt_count, lease_token, lease_owner,
                lease_expires_at, started_at, heartbeat_at)
SELECT 'default', 'noop', jsonb_build_object('n', g), 'running', 1, 1, 'gone',
       now() - interval '1 second', now() - interval '1 minute', now() - interval '1 minute'
FROM generate_series(1, %s::int) AS g
"""


class BenchError(Exception):
    """A scenario could not produce a trustworthy figure."""


class ScenarioUnavailable(Exception):
    """Raised by a scenario that cannot run here (e.g. a peer queue is not installed)."""


# -- settings and results ---------------------------------------------------------------


@dataclass(frozen=True)
class Settings:
    dsn: str
    jobs: int
    batch: int
    concurrency: int
    single: int
    repeat: int
    prune_old: int = 200_000
    wake_jobs: int = 200
    expired: int = 100_000
    claims: int = 2000
    backlogs: tuple[int, ...] = DEFAULT_BACKLOGS
    peer_jobs: int = DEFAULT_PEER_JOBS  # jobs per drain-procrastinate sample
    results_dir: pathlib.Path = DEFAULT_OUT.parent
    checkpoint: bool = False  # may this role run CHECKPOINT (see settle())


@dataclass(frozen=True)
class Sample:
    """One measurement. A rate metric's figure is ``jobs / seconds``; a metric that is not
    a rate (a latency, a duration, a share) sets ``value`` and that is its figure."""

    jobs: int  # the work the figure covers: jobs, claims, leases, latency samples
    seconds: float
    value: float | None = None

    @property
    def rate(self) -> float:
        return self.jobs / self.seconds if self.seconds > 0 else float("inf")

    @property
    def figure(self) -> float:
        return self.rate if self.value is None else self.value


@dataclass(frozen=True)
class Metric:
    """One figure a scenario reports, e.g. the worker's wall time or its own timer."""

    key: str  # unique over all scenarios; ratios refer to it
    scenario: str
    label: str
    unit: str = "jobs/s"  # "<things>/s" for rates; "ms", "s" or "%" for values


@dataclass
class Series:
    metric: Metric
    samples: list[Sample] = field(default_factory=list)

    def figures(self) -> list[float]:
        return [s.figure for s in self.samples]


@dataclass(frozen=True)
class Ratio:
    label: str
    numerator: str  # Metric.key
    denominator: str  # Metric.key
    inverse: bool = False  # report denominator/numerator (a time ratio from two rates)


ScenarioFn = Callable[[Settings], dict[str, Sample]]


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    metrics: tuple[Metric, ...]
    fn: ScenarioFn


# -- database helpers -------------------------------------------------------------------


def connect(dsn: str) -> psycopg.Connection[Any]:
    return psycopg.connect(dsn, autocommit=True, application_name="leaseq-bench")


def new_schema_name(scenario: str) -> str:
    return f"bench_{scenario.replace('-', '_')}_{secrets.token_hex(4)}"


@contextlib.contextmanager
def fresh_schema(settings: Settings, scenario: str) -> Iterator[leaseq.Client]:
    """A newly migrated schema and a sync client on it; the schema is dropped afterwards."""
    schema = new_schema_name(scenario)
    client = leaseq.Client(settings.dsn, schema=schema)
    try:
        client.migrate()  # also opens the client's pool, so no sample pays for connecting
        yield client
    finally:
        client.close()
        with connect(settings.dsn) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


def jobs_table(schema: str) -> sql.Composed:
    return sql.SQL("{}.jobs").format(sql.Identifier(schema))


def vacuum_analyze(conn: psycopg.Connection[Any], schema: str) -> None:
    conn.execute(sql.SQL("VACUUM (ANALYZE) {}").format(jobs_table(schema)))


def may_checkpoint(dsn: str) -> bool:
    """Superusers and members of pg_checkpoint may run CHECKPOINT."""
    with connect(dsn) as conn:
        row = conn.execute(
            "SELECT rolsuper OR pg_has_role(current_user, 'pg_checkpoint', 'member') "
            "FROM pg_roles WHERE rolname = current_user"
        ).fetchone()
    return bool(row and row[0])


def settle(settings: Settings, conn: psycopg.Connection[Any], schema: str) -> None:
    """Untimed, after a bulk fill: VACUUM (ANALYZE), then CHECKPOINT when allowed, so the
    checkpointer is not still writing out the fill (up to ~200 MB) while the clock runs."""
    vacuum_analyze(conn, schema)
    if settings.checkpoint:
        conn.execute("CHECKPOINT")


def insert_rows(conn: psycopg.Connection[Any], schema: str, template: str, count: int) -> None:
    """Untimed: ``count`` rows of one of the *_ROWS shapes, in one statement."""
    conn.execute(sql.SQL(template).format(jobs_table(schema)), (count,))


def fill_queue(settings: Settings, client: leaseq.Client) -> None:
    """Untimed: N pending no-op jobs, then VACUUM ANALYZE so every drain starts alike."""
    for start in range(0, settings.jobs, PREP_CHUNK):
        count = min(PREP_CHUNK, settings.jobs - start)
        client.enqueue_many(
            leaseq.JobSpec(TASK, {"n": start + i}, queue=QUEUE) for i in range(count)
        )
    with connect(settings.dsn) as conn:
        vacuum_analyze(conn, client.schema)


def status_counts(dsn: str, schema: str) -> dict[str, int]:
    with connect(dsn) as conn:
        rows = conn.execute(
            sql.SQL("SELECT status::text, count(*) FROM {} GROUP BY status").format(
                jobs_table(schema)
            )
        ).fetchall()
    return {str(status): int(count) for status, count in rows}


def check_drained(settings: Settings, schema: str) -> None:
    counts = status_counts(settings.dsn, schema)
    succeeded, total = counts.get("succeeded", 0), sum(counts.values())
    if succeeded != settings.jobs or total != settings.jobs:
        raise BenchError(
            f"drain left work undone: {succeeded} of {total} jobs succeeded, "
            f"{settings.jobs} were enqueued"
        )


def server_info(dsn: str) -> dict[str, Any]:
    with connect(dsn) as conn:
        row = conn.execute(
            "SELECT current_setting('server_version'), current_setting('fsync'), "
            "current_setting('synchronous_commit'), current_setting('shared_buffers'), "
            "current_setting('max_connections')"
        ).fetchone()
    assert row is not None
    names = ("server_version", "fsync", "synchronous_commit", "shared_buffers", "max_connections")
    return dict(zip(names, row, strict=True))


def leaseq_root() -> pathlib.Path:
    """The directory holding the leaseq package this process imported."""
    return pathlib.Path(leaseq.__file__).resolve().parent.parent


def worker_pythonpath(existing: str) -> str:
    """The worker imports the same leaseq as this process, and bench.apps from this repo."""
    entries = [str(leaseq_root()), str(REPO_ROOT), *existing.split(os.pathsep)]
    unique = [e for i, e in enumerate(entries) if e and e not in entries[:i]]
    return os.pathsep.join(unique)


def worker_env(settings: Settings, schema: str) -> dict[str, str]:
    env = dict(os.environ)
    env["LEASEQ_DSN"] = settings.dsn  # by env, not argv: keeps a password out of `ps`
    env["LEASEQ_SCHEMA"] = schema
    env["PYTHONPATH"] = worker_pythonpath(env.get("PYTHONPATH", ""))
    return env


def worker_command(*options: str) -> list[str]:
    return [
        sys.executable,
        "-P",  # no cwd on sys.path: leaseq comes from worker_pythonpath()
        "-m",
        "leaseq",
        "worker",
        WORKER_APP,
        *options,
    ]


def percentile(values: Sequence[float], pct: int) -> float:
    """The pct-th percentile (1-99), interpolated between the two nearest values."""
    if len(values) < 2:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[pct - 1]


def ms(seconds: float) -> float:
    return seconds * 1000.0


def size_label(n: int) -> str:
    """10000 -> 10k, 1000000 -> 1M (other numbers as they are)."""
    if n >= 1_000_000 and n % 1_000_000 == 0:
        return f"{n // 1_000_000}M"
    if n >= 1000 and n % 1000 == 0:
        return f"{n // 1000}k"
    return str(n)


def claim_params(owner: str, limit: int) -> dict[str, Any]:
    return {"queue": QUEUE, "owner": owner, "lease_seconds": 60.0, "limit": limit}


def claim_and_complete(
    conn: psycopg.Connection[Any], claim: str, complete: str, params: dict[str, Any]
) -> tuple[int, float]:
    """One claim_jobs statement and, if it claimed anything, one fenced complete_jobs for
    what it claimed: (how many jobs were completed, seconds the claim statement took)."""
    started = time.perf_counter()
    rows = conn.execute(claim, params).fetchall()
    claim_seconds = time.perf_counter() - started
    if not rows:
        return 0, claim_seconds
    rows.sort(key=lambda row: row[0])  # the fence wants ascending ids (_owned_by_token)
    fence = {  # array literals: as the client sends them (psycopg's list dumper is slow)
        "ids": "{" + ",".join(str(row[0]) for row in rows) + "}",
        "tokens": "{" + ",".join(str(row[1]) for row in rows) + "}",
        "owner": params["owner"],
    }
    return len(conn.execute(complete, fence).fetchall()), claim_seconds


# -- scenarios: drains and enqueues -----------------------------------------------------


def drain_raw(settings: Settings) -> dict[str, Sample]:
    """One autocommit connection, leaseq's own claim_jobs and complete_jobs texts, no
    asyncio, no pool, no Lease objects: the floor under any worker built on these
    statements."""
    with fresh_schema(settings, "drain-raw") as client:
        fill_queue(settings, client)
        queries = Queries(client.schema)
        claim, complete = queries["claim_jobs"], queries["complete_jobs"]
        params = claim_params(f"bench-raw:{os.getpid()}", settings.batch)
        done = 0
        with connect(settings.dsn) as conn:
            started = time.perf_counter()
            while n := claim_and_complete(conn, claim, complete, params)[0]:
                done += n
            elapsed = time.perf_counter() - started
        check_drained(settings, client.schema)
    return {"drain-raw": Sample(done, elapsed)}


def run_burst_worker(
    settings: Settings, schema: str, *options: str, cwd: pathlib.Path = REPO_ROOT
) -> tuple[float, list[re.Match[str]]]:
    """Run ``leaseq worker --burst`` to completion: (wall seconds, its 'processed' lines)."""
    command = worker_command(
        "--burst",
        "--concurrency",
        str(settings.concurrency),
        "--batch-size",
        str(settings.batch),
        *options,
    )
    env = worker_env(settings, schema)
    started = time.perf_counter()
    proc = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise BenchError(f"worker exited with {proc.returncode}: {proc.stderr.strip()[-2000:]}")
    lines = list(WORKER_LINE.finditer(proc.stdout))
    if not lines:
        raise BenchError(f"no 'processed ...' line in the worker's output: {proc.stdout!r}")
    return wall, lines


def drain_leaseq(settings: Settings) -> dict[str, Sample]:
    """A real ``leaseq worker --burst`` subprocess; wall time and the worker's own figure."""
    with fresh_schema(settings, "drain-leaseq") as client:
        fill_queue(settings, client)
        wall, lines = run_burst_worker(settings, client.schema)
        match = lines[0]
        processed = int(match["jobs"])
        if processed != settings.jobs or int(match["succeeded"]) != settings.jobs:
            raise BenchError(f"worker processed {processed} of {settings.jobs}: {match[0]}")
        # The printed rate has more significant digits than the printed seconds.
        own_seconds = processed / float(match["rate"])
        check_drained(settings, client.schema)
    return {
        "drain-leaseq-own": Sample(processed, own_seconds),
        "drain-leaseq-wall": Sample(processed, wall),
    }


def drain_leaseq_2p(settings: Settings) -> dict[str, Sample]:
    """``leaseq worker --burst --processes 2``: the supervisor and its two children, wall
    time only. Each child prints its own 'processed' line; together they must cover N."""
    with fresh_schema(settings, "drain-leaseq-2p") as client:
        fill_queue(settings, client)
        # The supervisor starts its children as `python -m leaseq` without -P, so their
        # sys.path begins with the working directory: run them in the directory leaseq
        # was imported from, so they import the same leaseq as this process.
        wall, lines = run_burst_worker(
            settings, client.schema, "--processes", "2", cwd=leaseq_root()
        )
        processed = sum(int(m["jobs"]) for m in lines)
        succeeded = sum(int(m["succeeded"]) for m in lines)
        if len(lines) != 2 or processed != settings.jobs or succeeded != settings.jobs:
            raise BenchError(
                f"2 worker processes processed {processed} of {settings.jobs}: "
                + "; ".join(m[0] for m in lines)
            )
        check_drained(settings, client.schema)
    return {"drain-leaseq-2p-wall": Sample(processed, wall)}


# -- scenarios: peer queues ---------------------------------------------------------------
#
# Each peer runs in subprocesses of its own (`python -P -m bench.peers PEER setup|drain`,
# see bench/peers/), in a schema of its own that the benchmark creates and drops. The
# setup (the peer's tables, N enqueued jobs) is untimed; the drain subprocess reports the
# time it measured itself (startup excluded), and the benchmark times its wall too. The
# benchmark then checks the peer's own tables: every job must have been processed once.


def pgqueuer_concurrency(settings: Settings) -> int:
    """pgqueuer refuses a max_concurrent_tasks below twice the batch size."""
    return max(settings.concurrency, 2 * settings.batch)


def require_packages(*packages: str) -> None:
    missing = [p for p in packages if importlib.util.find_spec(p) is None]
    if missing:
        raise ScenarioUnavailable(f"{', '.join(missing)} not installed ({BENCH_EXTRA})")


def package_version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


@contextlib.contextmanager
def peer_schema(settings: Settings, scenario: str) -> Iterator[str]:
    """An empty schema for a peer's tables; dropped (with everything in it) afterwards."""
    schema = new_schema_name(scenario)
    with connect(settings.dsn) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    try:
        yield schema
    finally:
        with connect(settings.dsn) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


def run_peer(settings: Settings, peer: str, *args: str) -> tuple[float, str]:
    """``python -P -m bench.peers PEER ARGS``: (wall seconds, its stdout)."""
    env = dict(os.environ)
    env["BENCH_PEER_DSN"] = settings.dsn  # by env, not argv: keeps a password out of `ps`
    env["PYTHONPATH"] = worker_pythonpath(env.get("PYTHONPATH", ""))
    command = [sys.executable, "-P", "-m", "bench.peers", peer, *args]
    started = time.perf_counter()
    try:
        proc = subprocess.run(
            command,
            cwd=REPO_ROOT,
            env=env,
            capture_output=True,
            text=True,
            check=False,
            timeout=PEER_TIMEOUT,
        )
    except subprocess.TimeoutExpired:
        raise BenchError(f"{peer} {args[0]} took more than {PEER_TIMEOUT:g} s") from None
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise BenchError(
            f"{peer} {args[0]} exited with {proc.returncode}: {proc.stderr.strip()[-2000:]}"
        )
    return wall, proc.stdout


@dataclass(frozen=True)
class PeerDrain:
    wall: float  # seconds from the subprocess's start to its exit
    own: float  # seconds the subprocess measured itself (startup excluded)
    last_handler: float | None  # ... from the same start until the last handler returned


def drain_peer(
    settings: Settings, peer: str, schema: str, jobs: int, tables: Sequence[str], *options: str
) -> PeerDrain:
    """Fill the peer's queue (untimed), VACUUM (ANALYZE) its tables as before every drain,
    then drain it with the peer's worker."""
    run_peer(settings, peer, "setup", "--schema", schema, "--jobs", str(jobs))
    with connect(settings.dsn) as conn:
        conn.execute(
            sql.SQL("VACUUM (ANALYZE) {}").format(
                sql.SQL(", ").join(sql.Identifier(schema, t) for t in tables)
            )
        )
    wall, out = run_peer(settings, peer, "drain", "--schema", schema, *options)
    lines = out.strip().splitlines()
    try:
        report = json.loads(lines[-1])
        processed, own = int(report["processed"]), float(report["seconds"])
        last = report.get("last_handler")
        last_handler = None if last is None else float(last)
    except (IndexError, ValueError, KeyError, TypeError, AttributeError):
        raise BenchError(f"{peer} drain printed no report: {out[-2000:]!r}") from None
    if processed != jobs:
        raise BenchError(f"{peer}'s handler ran {processed} times for {jobs} jobs")
    return PeerDrain(wall, own, last_handler)


def _drain_pgqueuer(settings: Settings, driver: str) -> PeerDrain:
    require_packages("pgqueuer", driver)
    with peer_schema(settings, "drain-pgqueuer") as schema:
        options = (
            "--driver",
            driver,
            "--batch",
            str(settings.batch),
            "--concurrency",
            str(pgqueuer_concurrency(settings)),
        )
        tables = ("pgqueuer", "pgqueuer_log")
        result = drain_peer(settings, "pgqueuer", schema, settings.jobs, tables, *options)
        # A finished job is deleted from the queue table and logged as 'successful'.
        query = sql.SQL(
            "SELECT (SELECT count(*) FROM {queue}), "
            "(SELECT count(DISTINCT job_id) FROM {log} WHERE status = 'successful'), "
            "(SELECT count(*) FROM {log} WHERE status NOT IN ('queued', 'picked', 'successful'))"
        ).format(queue=sql.Identifier(schema, "pgqueuer"), log=sql.Identifier(schema, tables[1]))
        with connect(settings.dsn) as conn:
            row = conn.execute(query).fetchone()
    left, succeeded, other = row if row is not None else (-1, -1, -1)
    if left != 0 or succeeded != settings.jobs or other != 0:
        raise BenchError(
            f"pgqueuer drain left work undone: {succeeded} of {settings.jobs} jobs logged "
            f"successful, {left} still queued, {other} other log rows"
        )
    return result


def drain_pgqueuer(settings: Settings) -> dict[str, Sample]:
    """pgqueuer's own worker (``pgqueuer.run``, as ``pgq run``) with its asyncpg driver,
    the one pgqueuer recommends for throughput."""
    result = _drain_pgqueuer(settings, "asyncpg")
    return {
        "drain-pgqueuer-own": Sample(settings.jobs, result.own),
        "drain-pgqueuer-wall": Sample(settings.jobs, result.wall),
    }


def drain_pgqueuer_psycopg(settings: Settings) -> dict[str, Sample]:
    """pgqueuer's own worker with its psycopg 3 driver (the driver family leaseq uses).
    That driver LISTENs on its one connection and waits on it with a 1 s timeout, so once
    the queue is empty and no NOTIFY comes, each of the worker's last statements waits up
    to 1 s for the connection: a tail of ~4 s. The third figure leaves it out."""
    result = _drain_pgqueuer(settings, "psycopg")
    if result.last_handler is None:
        raise BenchError("pgqueuer drain did not report when its last handler returned")
    return {
        "drain-pgqueuer-psycopg-own": Sample(settings.jobs, result.own),
        "drain-pgqueuer-psycopg-wall": Sample(settings.jobs, result.wall),
        "drain-pgqueuer-psycopg-handlers": Sample(settings.jobs, result.last_handler),
    }


def drain_procrastinate(settings: Settings) -> dict[str, Sample]:
    """procrastinate's own worker (``run_worker_async(wait=False)``) on --peer-jobs jobs."""
    require_packages("procrastinate")
    jobs = settings.peer_jobs
    with peer_schema(settings, "drain-procrastinate") as schema:
        tables = ("procrastinate_jobs", "procrastinate_events")
        options = ("--batch", str(settings.batch), "--concurrency", str(settings.concurrency))
        result = drain_peer(settings, "procrastinate", schema, jobs, tables, *options)
        with connect(settings.dsn) as conn:
            rows = conn.execute(
                sql.SQL("SELECT status::text, count(*) FROM {} GROUP BY 1").format(
                    sql.Identifier(schema, tables[0])
                )
            ).fetchall()
    counts = {str(status): int(n) for status, n in rows}
    if counts.get("succeeded", 0) != jobs or sum(counts.values()) != jobs:
        raise BenchError(f"procrastinate drain left work undone: {counts} of {jobs} jobs")
    return {
        "drain-procrastinate-own": Sample(jobs, result.own),
        "drain-procrastinate-wall": Sample(jobs, result.wall),
    }


def peer_summary(settings: Settings) -> dict[str, dict[str, Any]]:
    """The versions and settings of the peers, for the header and the JSON file."""
    return {
        "pgqueuer": {
            "version": package_version("pgqueuer"),
            "asyncpg": package_version("asyncpg"),
            "psycopg": package_version("psycopg"),
            "uvloop": package_version("uvloop"),
            "batch_size": settings.batch,
            "max_concurrent_tasks": pgqueuer_concurrency(settings),
            "jobs": settings.jobs,
            "durability": "durable",
        },
        "procrastinate": {
            "version": package_version("procrastinate"),
            "concurrency": settings.concurrency,
            "jobs": settings.peer_jobs,
        },
    }


def peer_header(series: dict[str, Series], settings: Settings) -> list[str]:
    peers = peer_summary(settings)
    lines = []
    if ran(series, "drain-pgqueuer") or ran(series, "drain-pgqueuer-psycopg"):
        p = peers["pgqueuer"]
        drivers = ", ".join(
            f"{name} {p[name]}"
            for name, scenario in (
                ("asyncpg", "drain-pgqueuer"),
                ("psycopg", "drain-pgqueuer-psycopg"),
            )
            if ran(series, scenario)
        )
        loop = f"uvloop {p['uvloop']}" if p["uvloop"] else "asyncio loop"
        lines.append(
            f"pgqueuer {p['version']}: QueueManager on 1 connection ({drivers}), "
            f"batch_size={p['batch_size']} max_concurrent_tasks={p['max_concurrent_tasks']}, "
            f"{loop}, durability=durable, N={p['jobs']:,}"
        )
    if ran(series, "drain-procrastinate"):
        p = peers["procrastinate"]
        lines.append(
            f"procrastinate {p['version']}: run_worker_async(concurrency={p['concurrency']}, "
            f"wait=False), one job per fetch, N={p['jobs']:,} (--peer-jobs: it is slow)"
        )
    return lines


def enqueue_single_raw(settings: Settings) -> dict[str, Sample]:
    """M single-row inserts on one autocommit connection, each its own transaction."""
    with fresh_schema(settings, "enqueue-single-raw") as client:
        insert = sql.SQL(
            "INSERT INTO {} (queue_name, task, payload) VALUES (%s, %s, %s::jsonb) RETURNING id"
        ).format(jobs_table(client.schema))
        with connect(settings.dsn) as conn:
            started = time.perf_counter()
            for i in range(settings.single):
                conn.execute(insert, (QUEUE, TASK, json.dumps({"n": i}))).fetchone()
            elapsed = time.perf_counter() - started
    return {"enqueue-single-raw": Sample(settings.single, elapsed)}


def enqueue_single(settings: Settings) -> dict[str, Sample]:
    """M ``Client.enqueue`` calls (sync client), each its own transaction."""
    with fresh_schema(settings, "enqueue-single") as client:
        started = time.perf_counter()
        for i in range(settings.single):
            client.enqueue(TASK, {"n": i}, queue=QUEUE)
        elapsed = time.perf_counter() - started
    return {"enqueue-single": Sample(settings.single, elapsed)}


def _chunks(n: int, size: int) -> list[range]:
    return [range(start, min(start + size, n)) for start in range(0, n, size)]


def enqueue_bulk_raw(settings: Settings) -> dict[str, Sample]:
    """Plain ``INSERT ... SELECT FROM unnest(jsonb[]) RETURNING id``: chunks of 1000, and
    all N in one statement (each in its own fresh schema)."""
    out: dict[str, Sample] = {}
    for key, size in (
        ("enqueue-bulk-raw-chunks", ENQUEUE_CHUNK),
        ("enqueue-bulk-raw-all", settings.jobs),
    ):
        with fresh_schema(settings, "enqueue-bulk-raw") as client:
            insert = sql.SQL(
                "INSERT INTO {} (queue_name, task, payload) "
                "SELECT %s, %s, p FROM unnest(%s::jsonb[]) AS u(p) RETURNING id"
            ).format(jobs_table(client.schema))
            chunks = _chunks(settings.jobs, size)
            with connect(settings.dsn) as conn:
                started = time.perf_counter()
                for chunk in chunks:
                    payloads = [json.dumps({"n": i}) for i in chunk]
                    conn.execute(insert, (QUEUE, TASK, payloads)).fetchall()
                elapsed = time.perf_counter() - started
        out[key] = Sample(settings.jobs, elapsed)
    return out


def enqueue_bulk(settings: Settings) -> dict[str, Sample]:
    """``Client.enqueue_many``: chunks of 1000, and all N in one call (each in its own
    fresh schema). The JobSpec objects are built before the clock starts; validation and
    encoding happen inside enqueue_many, so they are timed."""
    out: dict[str, Sample] = {}
    for key, size in (("enqueue-bulk-chunks", ENQUEUE_CHUNK), ("enqueue-bulk-all", settings.jobs)):
        with fresh_schema(settings, "enqueue-bulk") as client:
            batches = [
                [leaseq.JobSpec(TASK, {"n": i}, queue=QUEUE) for i in chunk]
                for chunk in _chunks(settings.jobs, size)
            ]
            started = time.perf_counter()
            for batch in batches:
                client.enqueue_many(batch)
            elapsed = time.perf_counter() - started
        out[key] = Sample(settings.jobs, elapsed)
    return out


# -- scenarios: claims under load, sweep, wake-up -----------------------------------------


class PruneThread(threading.Thread):
    """Runs ``Client.prune`` until a call prunes nothing; records when it stopped."""

    def __init__(self, client: leaseq.Client) -> None:
        super().__init__(name="bench-prune", daemon=True)
        self.client = client
        self.pruned = 0
        self.started_at = 0.0
        self.finished_at = 0.0
        self.error: BaseException | None = None

    def run(self) -> None:
        self.started_at = time.perf_counter()
        try:
            while n := self.client.prune(older_than=PRUNE_AGE, batch_size=PRUNE_BATCH):
                self.pruned += n
        except BaseException as exc:  # re-raised by the scenario, in the main thread
            self.error = exc
        finally:
            self.finished_at = time.perf_counter()

    def wait(self) -> None:
        if self.ident is not None:  # started
            self.join()


@dataclass
class ClaimRun:
    """Every claim+complete round trip of one claim-under-prune run."""

    starts: list[float]  # perf_counter() at each round trip's start
    latencies: list[float]  # seconds, each round trip
    seconds: float  # the whole run
    pruner: PruneThread | None


def _claim_under_prune_run(settings: Settings, with_prune: bool) -> ClaimRun:
    with fresh_schema(settings, "claim-under-prune") as client:
        schema = client.schema
        with connect(settings.dsn) as conn:
            insert_rows(conn, schema, OLD_SUCCEEDED_ROWS, settings.prune_old)
            insert_rows(conn, schema, PENDING_ROWS, settings.jobs)
            settle(settings, conn, schema)
        queries = Queries(schema)
        claim, complete = queries["claim_jobs"], queries["complete_jobs"]
        params = claim_params(f"bench-claim:{os.getpid()}", CLAIM_LIMIT)
        run = ClaimRun([], [], 0.0, None)
        done = 0
        with contextlib.ExitStack() as stack:
            if with_prune:
                prune_client = stack.enter_context(
                    leaseq.Client(settings.dsn, schema=schema, pool_size=1)
                )
                prune_client.check_schema()  # opens its pool before the clock starts
                run.pruner = PruneThread(prune_client)
                stack.callback(run.pruner.wait)  # ends before the client closes, even on error
            conn = stack.enter_context(connect(settings.dsn))
            if run.pruner is not None:
                run.pruner.start()
            started = time.perf_counter()
            while True:
                t0 = time.perf_counter()
                n = claim_and_complete(conn, claim, complete, params)[0]
                if not n:
                    break
                run.latencies.append(time.perf_counter() - t0)
                run.starts.append(t0)
                done += n
            run.seconds = time.perf_counter() - started
        if run.pruner is not None and run.pruner.error is not None:
            raise BenchError(f"prune failed: {run.pruner.error!r}") from run.pruner.error
        counts = status_counts(settings.dsn, schema)
    pruned = 0 if run.pruner is None else run.pruner.pruned
    if pruned not in (0, settings.prune_old) or (with_prune and pruned == 0):
        raise BenchError(f"prune removed {pruned} of {settings.prune_old} old jobs: {counts}")
    if done != settings.jobs or counts.get("succeeded", 0) != settings.jobs + (
        settings.prune_old - pruned
    ):
        raise BenchError(
            f"claim-under-prune completed {done} of {settings.jobs} pending jobs: {counts}"
        )
    return run


def claim_under_prune(settings: Settings) -> dict[str, Sample]:
    """The same table twice (old succeeded jobs + N pending), each in a fresh schema: the
    N pending jobs claimed and completed LIMIT 10 at a time, alone, then while another
    connection prunes every old row. The prune usually ends before the claims do, so the
    side-by-side figures cover the K claims made while it ran, against the same first K
    claims of the run without it (same jobs, same table state)."""
    alone = _claim_under_prune_run(settings, with_prune=False)
    pruned = _claim_under_prune_run(settings, with_prune=True)
    pruner = pruned.pruner
    assert pruner is not None
    k = sum(1 for t in pruned.starts if t < pruner.finished_at)
    if k < 10:
        raise BenchError(
            f"claim-under-prune: the prune ended after {k} claims; raise --prune-old so it "
            "overlaps more of them"
        )
    out: dict[str, Sample] = {}
    for tag, run in (("alone", alone), ("prune", pruned)):
        window = run.latencies[:k]
        out[f"cup-{tag}-rate"] = Sample(k, sum(window))
        out[f"cup-{tag}-p50"] = Sample(k, sum(window), ms(percentile(window, 50)))
        out[f"cup-{tag}-p99"] = Sample(k, sum(window), ms(percentile(window, 99)))
        out[f"cup-{tag}-all"] = Sample(len(run.latencies), run.seconds)
    out["cup-prune-rows"] = Sample(pruner.pruned, pruner.finished_at - pruner.started_at)
    return out


def sweep_recovery(settings: Settings) -> dict[str, Sample]:
    """``Client.sweep()`` recovering E expired leases (default batches of 1000)."""
    with fresh_schema(settings, "sweep-recovery") as client:
        with connect(settings.dsn) as conn:
            insert_rows(conn, client.schema, EXPIRED_LEASE_ROWS, settings.expired)
            settle(settings, conn, client.schema)
        started = time.perf_counter()
        result = client.sweep()
        elapsed = time.perf_counter() - started
        counts = status_counts(settings.dsn, client.schema)
    recovered = result.requeued + result.dead
    if recovered != settings.expired or counts.get("running", 0):
        raise BenchError(
            f"sweep recovered {recovered} of {settings.expired} expired leases; table: {counts}"
        )
    return {
        "sweep-rate": Sample(recovered, elapsed),
        "sweep-seconds": Sample(recovered, elapsed, elapsed),
    }


def explain_path(settings: Settings) -> pathlib.Path:
    return settings.results_dir / f"claim-explain-{size_label(max(settings.backlogs))}.txt"


def _write_explain(
    settings: Settings,
    conn: psycopg.Connection[Any],
    claim: str,
    params: dict[str, Any],
    backlog: int,
) -> None:
    """EXPLAIN (ANALYZE, BUFFERS) of one claim, in a transaction that is rolled back."""
    with conn.transaction(force_rollback=True):
        rows = conn.execute("EXPLAIN (ANALYZE, BUFFERS) " + claim, params).fetchall()
    path = explain_path(settings)
    path.parent.mkdir(parents=True, exist_ok=True)
    header = [
        f"-- claim_jobs (LIMIT {params['limit']}) with a backlog of {backlog:,} pending jobs",
        f"-- {dt.datetime.now(dt.UTC).isoformat(timespec='seconds')}, "
        f"{describe_dsn(settings.dsn)}, after {settings.claims:,} timed claims; "
        "run once, rolled back",
        "",
    ]
    path.write_text("\n".join([*header, *(str(row[0]) for row in rows)]) + "\n")


def claim_vs_backlog(settings: Settings) -> dict[str, Sample]:
    """For each backlog size B (a fresh schema each): B pending jobs, then K timed
    claim_jobs (LIMIT 10) + complete_jobs round trips. After each round trip, untimed,
    as many new pending jobs are inserted as were completed, so the backlog stays B."""
    out: dict[str, Sample] = {}
    for backlog in settings.backlogs:
        with fresh_schema(settings, "claim-vs-backlog") as client:
            schema = client.schema
            queries = Queries(schema)
            claim, complete = queries["claim_jobs"], queries["complete_jobs"]
            params = claim_params(f"bench-backlog:{os.getpid()}", CLAIM_LIMIT)
            refill = sql.SQL(PENDING_ROWS).format(jobs_table(schema))
            latencies: list[float] = []
            claim_only: list[float] = []
            with connect(settings.dsn) as conn:
                insert_rows(conn, schema, PENDING_ROWS, backlog)
                settle(settings, conn, schema)
                for _ in range(settings.claims):
                    t0 = time.perf_counter()
                    n, claim_seconds = claim_and_complete(conn, claim, complete, params)
                    latencies.append(time.perf_counter() - t0)
                    claim_only.append(claim_seconds)
                    if n != min(CLAIM_LIMIT, backlog):
                        raise BenchError(f"a claim from a backlog of {backlog} completed {n}")
                    conn.execute(refill, (n,))
                if backlog == max(settings.backlogs):
                    _write_explain(settings, conn, claim, params, backlog)
            counts = status_counts(settings.dsn, schema)
        if counts.get("pending") != backlog or counts.get("succeeded") != len(latencies) * min(
            CLAIM_LIMIT, backlog
        ):
            raise BenchError(f"claim-vs-backlog {backlog}: unexpected table state {counts}")
        seconds = sum(latencies)
        label = size_label(backlog)
        out[f"cvb-{label}-rate"] = Sample(len(latencies), seconds)
        out[f"cvb-{label}-p50"] = Sample(len(latencies), seconds, ms(percentile(latencies, 50)))
        out[f"cvb-{label}-p99"] = Sample(len(latencies), seconds, ms(percentile(latencies, 99)))
        out[f"cvb-{label}-claim"] = Sample(
            len(claim_only), sum(claim_only), ms(percentile(claim_only, 50))
        )
    return out


def _wait_for_listener(dsn: str, channel: str, proc: subprocess.Popen[bytes]) -> None:
    """Until the worker's LISTEN connection is up: a job enqueued before that would only
    be found by the poll, and measure the poll instead of the wake-up."""
    deadline = time.monotonic() + 30
    with connect(dsn) as conn:
        while time.monotonic() < deadline:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE application_name = 'leaseq-listener' AND query LIKE %s",
                ("LISTEN %" + channel + "%",),
            ).fetchone()
            if row is not None and row[0]:
                return
            if proc.poll() is not None:
                return  # the caller reports the exit
            time.sleep(0.05)
    raise BenchError("the wake-latency worker did not LISTEN within 30 s")


def _await_start(sock: socket.socket, index: int, proc: subprocess.Popen[bytes]) -> None:
    """Until the handler of job ``index`` has signalled that it started."""
    deadline = time.monotonic() + WAKE_TIMEOUT
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise BenchError(f"job {index} did not start within {WAKE_TIMEOUT:g} s")
        if proc.poll() is not None:
            raise BenchError(f"the wake-latency worker exited with {proc.returncode}")
        sock.settimeout(min(left, 1.0))
        try:
            data = sock.recv(64)
        except TimeoutError:
            continue
        if data == str(index).encode():
            return


def claim_index_scans(dsn: str, schema: str) -> int:
    """Index scans of jobs_claimable_idx so far: one per claim_jobs statement. Read after
    the worker exited (its backends flush their statistics when they disconnect), and
    re-read until it stops changing, since that flush is asynchronous to the exit."""
    query = (
        "SELECT coalesce(sum(idx_scan), 0) FROM pg_stat_user_indexes "
        "WHERE schemaname = %s AND indexrelname = 'jobs_claimable_idx'"
    )
    last = -1
    deadline = time.monotonic() + 5
    with connect(dsn) as conn:
        while True:
            row = conn.execute(query, (schema,)).fetchone()
            now = int(row[0]) if row is not None else 0
            if now == last or time.monotonic() > deadline:
                return now
            last = now
            time.sleep(0.3)


def _wake_latencies(settings: Settings, listen: bool) -> tuple[list[float], int]:
    """Seconds from the return of ``Client.enqueue`` (committed) to the handler's start,
    for each of the timed jobs, each enqueued on an idle queue; and how many claim_jobs
    statements the worker sent over its whole life (warm-up included)."""
    options = (
        ("--poll-interval", f"{WAKE_NOTIFY_POLL:g}")
        if listen
        else ("--no-listen", "--poll-interval", f"{WAKE_POLL:g}")
    )
    name = "wake-latency"
    with (
        fresh_schema(settings, name) as client,
        tempfile.TemporaryDirectory(prefix="leaseq-bench-") as tmp,
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock,
    ):
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
        stamps = pathlib.Path(tmp) / "started"
        log_path = pathlib.Path(tmp) / "worker.log"
        enqueued: dict[int, float] = {}
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                worker_command(*options),
                cwd=REPO_ROOT,
                env=worker_env(settings, client.schema),
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        try:
            if listen:
                _wait_for_listener(settings.dsn, client.channel, proc)
            for index in range(-WAKE_WARMUP, settings.wake_jobs):
                payload = {"i": index, "file": str(stamps), "port": port}
                client.enqueue(STAMP_TASK, payload, queue=QUEUE)
                enqueued[index] = time.time()
                _await_start(sock, index, proc)
                # A random part spanning one poll interval: arrivals land at random points
                # of the worker's poll cycle. (A fixed gap would lock onto that cycle, since
                # a finished job also wakes the worker's fetch loop and restarts its timer.)
                time.sleep(WAKE_GAP + random.uniform(0, WAKE_POLL))
        except BenchError as exc:
            raise BenchError(f"{exc}; worker output: {log_path.read_text()[-2000:]!r}") from None
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        started: dict[int, float] = {}
        for line in stamps.read_text().splitlines():
            index_text, at = line.split()
            started[int(index_text)] = float(at)
        claims = claim_index_scans(settings.dsn, client.schema)
    missing = [i for i in range(settings.wake_jobs) if i not in started]
    if missing:
        raise BenchError(f"wake-latency: {len(missing)} job(s) left no start time")
    return [started[i] - enqueued[i] for i in range(settings.wake_jobs)], claims


def wake_latency(settings: Settings) -> dict[str, Sample]:
    """A `leaseq worker` subprocess waiting on an idle queue; jobs enqueued one at a time.
    Once with LISTEN/NOTIFY (a slow poll behind it), once polling only."""
    out: dict[str, Sample] = {}
    for tag, listen in (("notify", True), ("poll", False)):
        latencies, claims = _wake_latencies(settings, listen)
        total = sum(latencies)
        for pct in (50, 95, 99):
            out[f"wake-{tag}-p{pct}"] = Sample(
                len(latencies), total, ms(percentile(latencies, pct))
            )
        jobs = len(latencies) + WAKE_WARMUP
        out[f"wake-{tag}-claims"] = Sample(jobs, total, claims / jobs)
    return out


# -- the scenario list ------------------------------------------------------------------


def _m(key: str, scenario: str, label: str, unit: str = "jobs/s") -> Metric:
    return Metric(key, scenario, label, unit)


def build_scenarios(backlogs: Sequence[int] = DEFAULT_BACKLOGS) -> tuple[Scenario, ...]:
    cup, cvb, wake = "claim-under-prune", "claim-vs-backlog", "wake-latency"
    backlog_metrics = tuple(
        _m(f"cvb-{size_label(b)}-{what}", cvb, f"backlog {size_label(b)}, {text}", unit)
        for b in backlogs
        for what, text, unit in (
            ("rate", f"claim+complete, LIMIT {CLAIM_LIMIT}", "claims/s"),
            ("p50", "claim+complete latency p50", "ms"),
            ("p99", "claim+complete latency p99", "ms"),
            ("claim", "claim_jobs alone (its commit included), p50", "ms"),
        )
    )
    return (
        Scenario(
            "drain-raw",
            "raw-SQL drain limit: claim_jobs + complete_jobs in a loop on one connection",
            (_m("drain-raw", "drain-raw", "claim_jobs+complete_jobs loop, 1 conn"),),
            drain_raw,
        ),
        Scenario(
            "drain-leaseq",
            "`leaseq worker --burst` subprocess draining the same N no-op jobs",
            (
                _m("drain-leaseq-wall", "drain-leaseq", "worker, wall (startup included)"),
                _m("drain-leaseq-own", "drain-leaseq", "worker, its own figure (startup excluded)"),
            ),
            drain_leaseq,
        ),
        Scenario(
            "drain-pgqueuer",
            "pgqueuer's own worker (asyncpg driver) draining the same N no-op jobs",
            (
                _m("drain-pgqueuer-wall", "drain-pgqueuer", "asyncpg driver, wall"),
                _m(
                    "drain-pgqueuer-own",
                    "drain-pgqueuer",
                    "asyncpg driver, its own figure (startup excluded)",
                ),
            ),
            drain_pgqueuer,
        ),
        Scenario(
            "drain-pgqueuer-psycopg",
            "pgqueuer's own worker (psycopg 3 driver) draining the same N no-op jobs",
            (
                _m("drain-pgqueuer-psycopg-wall", "drain-pgqueuer-psycopg", "psycopg driver, wall"),
                _m(
                    "drain-pgqueuer-psycopg-own",
                    "drain-pgqueuer-psycopg",
                    "psycopg driver, its own figure (startup excluded)",
                ),
                _m(
                    "drain-pgqueuer-psycopg-handlers",
                    "drain-pgqueuer-psycopg",
                    "psycopg driver, start to last handler (tail excluded)",
                ),
            ),
            drain_pgqueuer_psycopg,
        ),
        Scenario(
            "drain-procrastinate",
            "procrastinate's own worker draining --peer-jobs no-op jobs (fewer: it is slow)",
            (
                _m(
                    "drain-procrastinate-wall",
                    "drain-procrastinate",
                    "worker, wall (N=--peer-jobs)",
                ),
                _m(
                    "drain-procrastinate-own",
                    "drain-procrastinate",
                    "worker, its own figure (N=--peer-jobs)",
                ),
            ),
            drain_procrastinate,
        ),
        Scenario(
            "drain-leaseq-2p",
            "`leaseq worker --burst --processes 2` draining the same N no-op jobs",
            (
                _m(
                    "drain-leaseq-2p-wall",
                    "drain-leaseq-2p",
                    "--processes 2, wall (startup included)",
                ),
            ),
            drain_leaseq_2p,
        ),
        Scenario(
            "enqueue-single-raw",
            "M single-row INSERT ... RETURNING id, autocommit, one connection",
            (_m("enqueue-single-raw", "enqueue-single-raw", "INSERT ... RETURNING id, 1 conn"),),
            enqueue_single_raw,
        ),
        Scenario(
            "enqueue-single",
            "M Client.enqueue calls (sync client)",
            (_m("enqueue-single", "enqueue-single", "Client.enqueue"),),
            enqueue_single,
        ),
        Scenario(
            "enqueue-bulk-raw",
            "N rows by INSERT ... SELECT unnest(jsonb[]): chunks of 1000, and all at once",
            (
                _m(
                    "enqueue-bulk-raw-chunks",
                    "enqueue-bulk-raw",
                    f"unnest insert, {ENQUEUE_CHUNK}/stmt",
                ),
                _m("enqueue-bulk-raw-all", "enqueue-bulk-raw", "unnest insert, N in 1 stmt"),
            ),
            enqueue_bulk_raw,
        ),
        Scenario(
            "enqueue-bulk",
            "N jobs by Client.enqueue_many: chunks of 1000, and all at once",
            (
                _m("enqueue-bulk-chunks", "enqueue-bulk", f"enqueue_many, {ENQUEUE_CHUNK}/call"),
                _m("enqueue-bulk-all", "enqueue-bulk", "enqueue_many, N in 1 call"),
            ),
            enqueue_bulk,
        ),
        Scenario(
            cup,
            "claiming N pending jobs (LIMIT 10) next to old finished ones, alone and while "
            "Client.prune removes the old ones",
            (
                _m("cup-alone-rate", cup, "first K claims, no prune", "claims/s"),
                _m("cup-prune-rate", cup, "K claims made while prune ran", "claims/s"),
                _m("cup-alone-p50", cup, "first K claims, no prune, p50", "ms"),
                _m("cup-prune-p50", cup, "K claims made while prune ran, p50", "ms"),
                _m("cup-alone-p99", cup, "first K claims, no prune, p99", "ms"),
                _m("cup-prune-p99", cup, "K claims made while prune ran, p99", "ms"),
                _m("cup-alone-all", cup, "all N/10 claims, no prune", "claims/s"),
                _m("cup-prune-all", cup, "all N/10 claims, prune running at first", "claims/s"),
                _m("cup-prune-rows", cup, "prune (batches of 1000), next to the claims", "rows/s"),
            ),
            claim_under_prune,
        ),
        Scenario(
            cvb,
            "claim_jobs (LIMIT 10) + complete_jobs round trips at growing pending backlogs",
            backlog_metrics,
            claim_vs_backlog,
        ),
        Scenario(
            "sweep-recovery",
            "Client.sweep() recovering E expired leases",
            (
                _m("sweep-rate", "sweep-recovery", "Client.sweep()", "leases/s"),
                _m("sweep-seconds", "sweep-recovery", "Client.sweep(), total (target <= 10)", "s"),
            ),
            sweep_recovery,
        ),
        Scenario(
            wake,
            "enqueue -> handler start on an idle queue, `leaseq worker` with NOTIFY and "
            "polling only",
            tuple(
                _m(f"wake-{tag}-{what}", wake, f"{text}, {label}", unit)
                for tag, text in (
                    ("notify", f"NOTIFY, --poll-interval {WAKE_NOTIFY_POLL:g}"),
                    ("poll", f"--no-listen --poll-interval {WAKE_POLL:g}"),
                )
                for what, label, unit in (
                    ("p50", "p50", "ms"),
                    ("p95", "p95", "ms"),
                    ("p99", "p99", "ms"),
                    ("claims", "worker claim statements per job", "claims/job"),
                )
            ),
            wake_latency,
        ),
    )


def build_ratios(backlogs: Sequence[int] = DEFAULT_BACKLOGS) -> tuple[Ratio, ...]:
    backlog_ratios: list[Ratio] = []
    base = min(backlogs)
    for big in sorted(b for b in backlogs if b != base):
        pair = f"{size_label(big)}/{size_label(base)}"
        target = " (target <= 1.5)" if (base, big) == (10_000, 1_000_000) else ""
        b, s = size_label(big), size_label(base)
        backlog_ratios += [
            Ratio(
                f"claim+complete mean time, backlog {pair}{target}",
                f"cvb-{b}-rate",
                f"cvb-{s}-rate",
                inverse=True,
            ),
            Ratio(f"claim+complete p50, backlog {pair}", f"cvb-{b}-p50", f"cvb-{s}-p50"),
            Ratio(f"claim+complete p99, backlog {pair}", f"cvb-{b}-p99", f"cvb-{s}-p99"),
            Ratio(f"claim_jobs alone p50, backlog {pair}", f"cvb-{b}-claim", f"cvb-{s}-claim"),
        ]
    return (
        Ratio(
            "leaseq drain / raw drain (worker's own figure; target >= 0.65)",
            "drain-leaseq-own",
            "drain-raw",
        ),
        Ratio(
            "leaseq drain / raw drain (wall, startup included)", "drain-leaseq-wall", "drain-raw"
        ),
        Ratio(
            "leaseq drain, 2 processes / 1 process (wall)",
            "drain-leaseq-2p-wall",
            "drain-leaseq-wall",
        ),
        Ratio(
            "leaseq drain / pgqueuer drain, asyncpg (own figures; target >= 2)",
            "drain-leaseq-own",
            "drain-pgqueuer-own",
        ),
        Ratio(
            "leaseq drain / pgqueuer drain, psycopg (own figures)",
            "drain-leaseq-own",
            "drain-pgqueuer-psycopg-own",
        ),
        Ratio(
            "leaseq drain / procrastinate drain (own figures; N differs)",
            "drain-leaseq-own",
            "drain-procrastinate-own",
        ),
        Ratio("leaseq single enqueue / raw insert", "enqueue-single", "enqueue-single-raw"),
        Ratio(
            f"leaseq bulk enqueue / raw bulk insert ({ENQUEUE_CHUNK}/stmt)",
            "enqueue-bulk-chunks",
            "enqueue-bulk-raw-chunks",
        ),
        Ratio(
            "leaseq bulk enqueue / raw bulk insert (N in 1)",
            "enqueue-bulk-all",
            "enqueue-bulk-raw-all",
        ),
        Ratio("claims/s while pruning / no prune (K claims)", "cup-prune-rate", "cup-alone-rate"),
        Ratio("claim p50 while pruning / no prune (K claims)", "cup-prune-p50", "cup-alone-p50"),
        Ratio("claim p99 while pruning / no prune (K claims)", "cup-prune-p99", "cup-alone-p99"),
        Ratio("claims/s with prune / no prune (all N/10)", "cup-prune-all", "cup-alone-all"),
        *backlog_ratios,
        Ratio("wake-up p50, polling only / NOTIFY", "wake-poll-p50", "wake-notify-p50"),
    )


SCENARIOS: tuple[Scenario, ...] = build_scenarios()
RATIOS: tuple[Ratio, ...] = build_ratios()


# -- running and reporting --------------------------------------------------------------


def select_scenarios(
    patterns: Sequence[str], scenarios: Sequence[Scenario] = SCENARIOS
) -> list[Scenario]:
    if not patterns:
        return list(scenarios)
    wanted = [p.strip() for item in patterns for p in item.split(",") if p.strip()]
    chosen: list[Scenario] = []
    for pattern in wanted:
        hits = [s for s in scenarios if fnmatch.fnmatchcase(s.name, pattern)]
        if not hits:
            names = ", ".join(s.name for s in scenarios)
            raise SystemExit(f"bench: error: no scenario matches {pattern!r} (have: {names})")
        chosen.extend(s for s in hits if s not in chosen)
    # Keep the canonical order: a raw scenario runs right before its leaseq twin.
    return [s for s in scenarios if s in chosen]


def spread(values: Sequence[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def round_ratios(series: dict[str, Series], ratio: Ratio) -> list[float] | None:
    num, den = series.get(ratio.numerator), series.get(ratio.denominator)
    if num is None or den is None or not num.samples or not den.samples:
        return None
    pairs = zip(num.figures(), den.figures(), strict=False)
    return [b / a if ratio.inverse else a / b for a, b in pairs]


def fmt_figure(value: float, unit: str) -> str:
    if unit.endswith("/s"):
        return f"{value:,.0f}"
    if unit == "%":
        return f"{value:.0f}"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], right: set[int]) -> str:
    widths = [max(len(r[i]) for r in [headers, *rows]) for i in range(len(headers))]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(headers), rule, *(line(r) for r in rows)])


def ran(series: dict[str, Series], scenario: str) -> bool:
    return any(s.samples and s.metric.scenario == scenario for s in series.values())


def display_path(path: pathlib.Path) -> str:
    try:
        return str(path.resolve().relative_to(pathlib.Path.cwd()))
    except ValueError:
        return str(path)


def render(
    series: dict[str, Series],
    settings: Settings,
    info: dict[str, Any],
    ratios: Sequence[Ratio] = RATIOS,
    skipped: dict[str, str] | None = None,
) -> str:
    rows: list[list[str]] = []
    for s in series.values():
        if not s.samples:
            continue
        st = spread(s.figures())
        unit = s.metric.unit
        rows.append(
            [
                s.metric.scenario,
                s.metric.label,
                f"{s.samples[0].jobs:,}",
                fmt_figure(st["median"], unit),
                f"{fmt_figure(st['min'], unit)}-{fmt_figure(st['max'], unit)}",
                unit,
            ]
        )
    headers = ["scenario", "what", "n", "median", "min-max", "unit"]
    out = [
        f"leaseq bench: {describe_dsn(settings.dsn)}, PostgreSQL {info['server_version']} "
        f"(fsync={info['fsync']}, synchronous_commit={info['synchronous_commit']}), "
        f"{os.cpu_count()} CPUs",
        *([] if leaseq_root() == REPO_ROOT else [f"leaseq imported from {leaseq_root()}"]),
        f"jobs={settings.jobs:,} batch={settings.batch} concurrency={settings.concurrency} "
        f"single={settings.single:,} repeat={settings.repeat} prune-old={settings.prune_old:,} "
        f"claims={settings.claims:,} backlogs={','.join(map(size_label, settings.backlogs))} "
        f"expired={settings.expired:,} wake-jobs={settings.wake_jobs} "
        f"checkpoint-after-fill={'yes' if settings.checkpoint else 'no (not allowed)'}",
        *peer_header(series, settings),
        "",
        _table(headers, rows, right={2, 3, 4}),
    ]
    ratio_rows: list[list[str]] = []
    for ratio in ratios:
        values = round_ratios(series, ratio)
        if values:
            st = spread(values)
            ratio_rows.append(
                [ratio.label, f"{st['median']:.2f}", f"{st['min']:.2f}-{st['max']:.2f}"]
            )
    if ratio_rows:
        out += ["", _table(["ratio (per round)", "median", "min-max"], ratio_rows, right={1, 2})]
    if skipped:
        out += ["", *(f"skipped {name}: {why}" for name, why in skipped.items())]
    if ran(series, "claim-vs-backlog"):
        explain = explain_path(settings)
        out += [
            "",
            f"claim-vs-backlog: EXPLAIN (ANALYZE, BUFFERS) of one claim at backlog "
            f"{size_label(max(settings.backlogs))} (last round): {display_path(explain)}",
        ]
    return "\n".join(out)


def git_revision() -> str | None:
    """HEAD of this repo, with "+dirty" when leaseq/ or bench/ has uncommitted changes."""
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "leaseq", "bench"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return rev + ("+dirty" if dirty else "")


def results_json(
    series: dict[str, Series],
    settings: Settings,
    info: dict[str, Any],
    ratios: Sequence[Ratio] = RATIOS,
    skipped: dict[str, str] | None = None,
) -> dict[str, Any]:
    metrics = []
    for s in series.values():
        if s.samples:
            metrics.append(
                {
                    "key": s.metric.key,
                    "scenario": s.metric.scenario,
                    "label": s.metric.label,
                    "unit": s.metric.unit,
                    "jobs": s.samples[0].jobs,
                    "figure": spread(s.figures()),
                    "samples": [
                        {"jobs": x.jobs, "seconds": x.seconds, "figure": x.figure}
                        for x in s.samples
                    ],
                }
            )
    ratio_list = []
    for ratio in ratios:
        values = round_ratios(series, ratio)
        if values:
            ratio_list.append(
                {
                    "label": ratio.label,
                    "numerator": ratio.numerator,
                    "denominator": ratio.denominator,
                    "inverse": ratio.inverse,
                    "per_round": values,
                    **spread(values),
                }
            )
    explain = explain_path(settings) if ran(series, "claim-vs-backlog") else None
    return {
        "when": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "leaseq_version": leaseq.__version__,
        "leaseq_path": str(leaseq_root()),
        "git": git_revision(),
        "leaseq_from_repo": leaseq_root() == REPO_ROOT,
        "python": platform.python_version(),
        "psycopg": psycopg.__version__,
        "cpus": os.cpu_count(),
        "database": describe_dsn(settings.dsn),
        "server": info,
        "settings": {
            "jobs": settings.jobs,
            "batch": settings.batch,
            "concurrency": settings.concurrency,
            "single": settings.single,
            "repeat": settings.repeat,
            "prune_old": settings.prune_old,
            "claims": settings.claims,
            "backlogs": list(settings.backlogs),
            "expired": settings.expired,
            "wake_jobs": settings.wake_jobs,
            "peer_jobs": settings.peer_jobs,
            "checkpoint_after_fill": settings.checkpoint,
        },
        "peers": peer_summary(settings),
        "metrics": metrics,
        "ratios": ratio_list,
        "skipped": dict(skipped or {}),
        "claim_explain": None if explain is None else str(explain),
    }


def _backlogs(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(sorted({int(x.replace("_", "")) for x in text.split(",") if x.strip()}))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of sizes: {text!r}") from None
    if not sizes or sizes[0] < 1:
        raise argparse.ArgumentTypeError("backlog sizes must be at least 1")
    return sizes


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    names = ", ".join(s.name for s in SCENARIOS)
    p = argparse.ArgumentParser(
        prog="python -m bench",
        description="leaseq against the raw-SQL limit, measured in one run. "
        "Prints each figure (median and min-max over the repeats) and ratios.",
    )
    p.add_argument(
        "--dsn",
        default=None,
        help="PostgreSQL DSN (default: env LEASEQ_DSN, else leaseq's embedded server)",
    )
    p.add_argument(
        "--jobs",
        "-n",
        type=int,
        default=20000,
        help="jobs per drain / bulk enqueue; pending jobs claimed in claim-under-prune",
    )
    p.add_argument("--batch", "-b", type=int, default=100, help="claim batch size")
    p.add_argument(
        "--concurrency",
        "-c",
        type=int,
        default=None,
        help="worker concurrency (default: 2 x --batch, so claims overlap completions)",
    )
    p.add_argument("--single", "-m", type=int, default=5000, help="single-row enqueues per sample")
    p.add_argument("--repeat", "-r", type=int, default=3, help="samples per scenario")
    p.add_argument(
        "--prune-old",
        type=int,
        default=200_000,
        help="claim-under-prune: old succeeded jobs in the table (all pruned)",
    )
    p.add_argument(
        "--claims",
        type=int,
        default=2000,
        help="claim-vs-backlog: timed claim+complete round trips per backlog size",
    )
    p.add_argument(
        "--backlogs",
        type=_backlogs,
        default=DEFAULT_BACKLOGS,
        metavar="N,N,...",
        help="claim-vs-backlog: pending backlog sizes (default: 10000,100000,1000000)",
    )
    p.add_argument(
        "--expired", type=int, default=100_000, help="sweep-recovery: expired leases to sweep"
    )
    p.add_argument(
        "--wake-jobs", type=int, default=200, help="wake-latency: timed jobs per variant"
    )
    p.add_argument(
        "--peer-jobs",
        type=int,
        default=DEFAULT_PEER_JOBS,
        help=f"drain-procrastinate: jobs per drain (default {DEFAULT_PEER_JOBS}; "
        "procrastinate drains a few hundred jobs/s, so --jobs would take minutes)",
    )
    p.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="NAME",
        help=f"run only these scenarios (repeatable, comma-separated, globs ok): {names}",
    )
    p.add_argument(
        "--out",
        type=pathlib.Path,
        default=DEFAULT_OUT,
        help="JSON results file (default: bench/results/latest.json); the claim-vs-backlog "
        "EXPLAIN goes to the same directory",
    )
    p.add_argument("--list", action="store_true", help="list the scenarios and exit")
    args = p.parse_args(argv)
    for name in (
        "jobs",
        "batch",
        "single",
        "repeat",
        "prune_old",
        "claims",
        "expired",
        "peer_jobs",
    ):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.wake_jobs < 2:
        p.error("--wake-jobs must be at least 2")
    if args.concurrency is not None and args.concurrency < 1:
        p.error("--concurrency must be at least 1")
    return args


def resolve_bench_dsn(explicit: str | None) -> str:
    if explicit:
        return explicit
    from_env = os.environ.get("LEASEQ_DSN", "").strip()
    if from_env:
        return from_env
    from leaseq.dev.embedded import embedded_dsn

    return embedded_dsn()


def _progress(key: str, sample: Sample, unit: str) -> str:
    text = f"{key} {fmt_figure(sample.figure, unit)} {unit}"
    return text + (f" ({sample.seconds:.2f}s)" if sample.value is None else "")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    all_scenarios = build_scenarios(args.backlogs)
    ratios = build_ratios(args.backlogs)
    if args.list:
        for s in all_scenarios:
            print(f"{s.name:20}  {s.description}")
        return 0
    scenarios = select_scenarios(args.only, all_scenarios)
    out: pathlib.Path = args.out
    settings = Settings(
        dsn=resolve_bench_dsn(args.dsn),
        jobs=args.jobs,
        batch=args.batch,
        concurrency=args.concurrency or 2 * args.batch,
        single=args.single,
        repeat=args.repeat,
        prune_old=args.prune_old,
        wake_jobs=args.wake_jobs,
        expired=args.expired,
        claims=args.claims,
        backlogs=args.backlogs,
        peer_jobs=args.peer_jobs,
        results_dir=out.parent,
    )
    settings = dataclasses.replace(settings, checkpoint=may_checkpoint(settings.dsn))
    info = server_info(settings.dsn)
    series = {m.key: Series(m) for s in scenarios for m in s.metrics}
    unavailable: dict[str, str] = {}
    try:
        for round_no in range(1, settings.repeat + 1):
            for scenario in scenarios:
                if scenario.name in unavailable:
                    continue
                try:
                    samples = scenario.fn(settings)
                except ScenarioUnavailable as exc:
                    unavailable[scenario.name] = str(exc)
                    print(f"{scenario.name}: skipped: {exc}", file=sys.stderr, flush=True)
                    continue
                parts = []
                for key, sample in samples.items():
                    series[key].samples.append(sample)
                    parts.append(_progress(key, sample, series[key].metric.unit))
                print(
                    f"[{round_no}/{settings.repeat}] {scenario.name}: " + ", ".join(parts),
                    file=sys.stderr,
                    flush=True,
                )
    except KeyboardInterrupt:
        print("bench: interrupted", file=sys.stderr)
        return 130
    except BenchError as exc:
        print(f"bench: error: {exc}", file=sys.stderr)
        return 1
    print(render(series, settings, info, ratios, unavailable))
    out.parent.mkdir(parents=True, exist_ok=True)
    results = results_json(series, settings, info, ratios, unavailable)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"\nresults: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
