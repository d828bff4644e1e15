"""Peer-queue drain scenarios (``drain-pgqueuer``, ``drain-pgqueuer-psycopg``,
``drain-procrastinate``): driving the peer subprocesses of ``bench.peers``, checking the
peers' own tables, the leaseq/peer ratios, and the peers' versions and settings for the
report header and the JSON file.

Each peer runs in subprocesses of its own (`python -P -m bench.peers PEER setup|drain`,
see bench/peers/), in a schema of its own that the benchmark creates and drops. The
setup (the peer's tables, N enqueued jobs) is untimed; the drain subprocess reports the
time it measured itself (startup excluded), and the benchmark times its wall too. The
benchmark then checks the peer's own tables: every job must have been processed once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from psycopg import sql

from bench.db import connect, empty_schema
from bench.harness import (
    REPO_ROOT,
    BenchError,
    Metric,
    Ratio,
    Sample,
    Scenario,
    Series,
    Settings,
    package_version,
    ran,
    require_packages,
    worker_pythonpath,
)
from bench.peers import DSN_ENV

PEER_TIMEOUT = 600.0  # longest a peer's setup or drain subprocess may take


def pgqueuer_concurrency(settings: Settings) -> int:
    """pgqueuer refuses a max_concurrent_tasks below twice the batch size."""
    return max(settings.concurrency, 2 * settings.batch)


def run_peer(settings: Settings, peer: str, *args: str) -> tuple[float, str]:
    """``python -P -m bench.peers PEER ARGS``: (wall seconds, its stdout)."""
    env = dict(os.environ)
    env[DSN_ENV] = settings.dsn  # by env, not argv: keeps a password out of `ps`
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


def drain_pgqueuer_driver(settings: Settings, driver: str) -> PeerDrain:
    require_packages("pgqueuer", driver)
    with empty_schema(settings.dsn, "drain-pgqueuer") as schema:
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
    result = drain_pgqueuer_driver(settings, "asyncpg")
    return {
        "drain-pgqueuer-own": Sample(settings.jobs, result.own),
        "drain-pgqueuer-wall": Sample(settings.jobs, result.wall),
    }


def drain_pgqueuer_psycopg(settings: Settings) -> dict[str, Sample]:
    """pgqueuer's own worker with its psycopg 3 driver (the driver family leaseq uses).
    That driver LISTENs on its one connection and waits on it with a 1 s timeout, so once
    the queue is empty and no NOTIFY comes, each of the worker's last statements waits up
    to 1 s for the connection: a tail of ~4 s. The third figure leaves it out."""
    result = drain_pgqueuer_driver(settings, "psycopg")
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
    with empty_schema(settings.dsn, "drain-procrastinate") as schema:
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


SCENARIOS = (
    Scenario(
        "drain-pgqueuer",
        "pgqueuer's own worker (asyncpg driver) draining the same N no-op jobs",
        (
            Metric("drain-pgqueuer-wall", "drain-pgqueuer", "asyncpg driver, wall"),
            Metric(
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
            Metric("drain-pgqueuer-psycopg-wall", "drain-pgqueuer-psycopg", "psycopg driver, wall"),
            Metric(
                "drain-pgqueuer-psycopg-own",
                "drain-pgqueuer-psycopg",
                "psycopg driver, its own figure (startup excluded)",
            ),
            Metric(
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
            Metric(
                "drain-procrastinate-wall", "drain-procrastinate", "worker, wall (N=--peer-jobs)"
            ),
            Metric(
                "drain-procrastinate-own",
                "drain-procrastinate",
                "worker, its own figure (N=--peer-jobs)",
            ),
        ),
        drain_procrastinate,
    ),
)

RATIOS = (
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
)
