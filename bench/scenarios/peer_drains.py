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
import sys
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
    run_processes,
    worker_pythonpath,
)
from bench.peers import DSN_ENV


def pgqueuer_concurrency(settings: Settings) -> int:
    """pgqueuer refuses a max_concurrent_tasks below twice the batch size."""
    return max(settings.concurrency, 2 * settings.batch)


def peer_env(settings: Settings) -> dict[str, str]:
    env = dict(os.environ)
    env[DSN_ENV] = settings.dsn  # by env, not argv: keeps a password out of `ps`
    env["PYTHONPATH"] = worker_pythonpath(env.get("PYTHONPATH", ""))
    return env


def peer_command(peer: str, *args: str) -> list[str]:
    return [sys.executable, "-P", "-m", "bench.peers", peer, *args]


def run_peer(settings: Settings, peer: str, *args: str) -> tuple[float, str]:
    """``python -P -m bench.peers PEER ARGS``: (wall seconds, its stdout)."""
    wall, outputs = run_processes([peer_command(peer, *args)], peer_env(settings), REPO_ROOT)
    return wall, outputs[0]


@dataclass(frozen=True)
class PeerDrain:
    wall: float  # seconds from the first subprocess's start to the last one's exit
    own: float  # the longest time a subprocess measured itself (startup excluded)
    last_handler: float | None  # ... from the same start until the last handler returned


def drain_peer(
    settings: Settings,
    peer: str,
    schema: str,
    jobs: int,
    tables: Sequence[str],
    *options: str,
    processes: int = 1,
) -> PeerDrain:
    """Fill the peer's queue (untimed), VACUUM (ANALYZE) its tables as before every drain,
    then drain it with ``processes`` of the peer's workers started at once."""
    run_peer(settings, peer, "setup", "--schema", schema, "--jobs", str(jobs))
    with connect(settings.dsn) as conn:
        conn.execute(
            sql.SQL("VACUUM (ANALYZE) {}").format(
                sql.SQL(", ").join(sql.Identifier(schema, t) for t in tables)
            )
        )
    command = peer_command(peer, "drain", "--schema", schema, *options)
    wall, outputs = run_processes([command] * processes, peer_env(settings), REPO_ROOT)
    processed, own, last_handler = 0, 0.0, None
    for out in outputs:
        lines = out.strip().splitlines()
        try:
            report = json.loads(lines[-1])
            processed += int(report["processed"])
            own = max(own, float(report["seconds"]))
            last = report.get("last_handler")
            if last is not None:
                last_handler = max(last_handler or 0.0, float(last))
        except (IndexError, ValueError, KeyError, TypeError, AttributeError):
            raise BenchError(f"{peer} drain printed no report: {out[-2000:]!r}") from None
    if processed != jobs:
        raise BenchError(f"{peer}'s handler ran {processed} times for {jobs} jobs")
    return PeerDrain(wall, own, last_handler)


@dataclass(frozen=True)
class PgqDrain:
    drain: PeerDrain
    db: float  # start-up excluded, on the database's clock (see drain_pgqueuer_driver)


def drain_pgqueuer_driver(settings: Settings, driver: str, processes: int = 1) -> PgqDrain:
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
        result = drain_peer(
            settings, "pgqueuer", schema, settings.jobs, tables, *options, processes=processes
        )
        # A finished job is deleted from the queue table and logged as 'successful'. The
        # database's clock, as for leaseq (bench.db.drain_clock): from the first 'picked'
        # log row (written by the dequeue statement) to the last 'successful' one (written
        # by the completion), each stamped with its transaction's start.
        query = sql.SQL(
            "SELECT (SELECT count(*) FROM {queue}), "
            "(SELECT count(DISTINCT job_id) FROM {log} WHERE status = 'successful'), "
            "(SELECT count(*) FROM {log} WHERE status NOT IN ('queued', 'picked', 'successful')), "
            "(SELECT extract(epoch FROM max(created) FILTER (WHERE status = 'successful') "
            "  - min(created) FILTER (WHERE status = 'picked'))::float8 FROM {log})"
        ).format(queue=sql.Identifier(schema, "pgqueuer"), log=sql.Identifier(schema, tables[1]))
        with connect(settings.dsn) as conn:
            row = conn.execute(query).fetchone()
    left, succeeded, other, db = row if row is not None else (-1, -1, -1, None)
    if left != 0 or succeeded != settings.jobs or other != 0 or not db:
        raise BenchError(
            f"pgqueuer drain left work undone: {succeeded} of {settings.jobs} jobs logged "
            f"successful, {left} still queued, {other} other log rows"
        )
    return PgqDrain(result, float(db))


def pgqueuer_scenario(name: str, processes: int) -> Scenario:
    def fn(settings: Settings) -> dict[str, Sample]:
        result = drain_pgqueuer_driver(settings, "asyncpg", processes)
        return {
            f"{name}-db": Sample(settings.jobs, result.db),
            f"{name}-wall": Sample(settings.jobs, result.drain.wall),
        }

    return Scenario(
        name,
        f"pgqueuer's own worker (asyncpg driver), {processes} process"
        f"{'es' if processes > 1 else ''} at once, draining the same N no-op jobs",
        (
            Metric(f"{name}-db", name, f"pgqueuer, {processes}p, start-up excluded"),
            Metric(f"{name}-wall", name, f"pgqueuer, {processes}p, process wall"),
        ),
        fn,
    )


def drain_pgqueuer_psycopg(settings: Settings) -> dict[str, Sample]:
    """pgqueuer's own worker with its psycopg 3 driver (the driver family leaseq uses).
    That driver LISTENs on its one connection and waits on it with a 1 s timeout, so once
    the queue is empty and no NOTIFY comes, each of the worker's last statements waits up
    to 1 s for the connection: a tail of ~4 s. The third figure leaves it out."""
    result = drain_pgqueuer_driver(settings, "psycopg").drain
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
    asyncpg_ran = ran(series, "drain-pgqueuer") or ran(series, "drain-pgqueuer-2p")
    if asyncpg_ran or ran(series, "drain-pgqueuer-psycopg"):
        p = peers["pgqueuer"]
        drivers = ", ".join(
            f"{name} {p[name]}"
            for name, did in (
                ("asyncpg", asyncpg_ran),
                ("psycopg", ran(series, "drain-pgqueuer-psycopg")),
            )
            if did
        )
        loop = f"uvloop {p['uvloop']}" if p["uvloop"] else "asyncio loop"
        lines.append(
            f"pgqueuer {p['version']}: QueueManager on 1 connection per process ({drivers}), "
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


PGQUEUER_1P = pgqueuer_scenario("drain-pgqueuer", 1)
PGQUEUER_2P = pgqueuer_scenario("drain-pgqueuer-2p", 2)

OTHERS = (  # opt-in: --only drain-pgqueuer-psycopg,drain-procrastinate
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
        default=False,
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
        default=False,
    ),
)


def _ratios() -> list[Ratio]:
    """leaseq against pgqueuer at the same process count, on the same clock."""
    out = []
    for p, suffix in ((1, ""), (2, "-2p")):
        for kind, task in (("async", ""), ("sync", "-sync")):
            for clock, label in (("db", "start-up excluded"), ("wall", "process wall")):
                target = " (target >= 2)" if (p, kind, clock) == (2, "async", "db") else ""
                out.append(
                    Ratio(
                        f"leaseq {kind} {p}p / pgqueuer {p}p, {label}{target}",
                        f"drain-leaseq{task}{suffix}-{clock}",
                        f"drain-pgqueuer{suffix}-{clock}",
                    )
                )
    for clock, label in (("db", "start-up excluded"), ("wall", "process wall")):
        out.append(
            Ratio(
                f"leaseq async 2p --adaptive-batch / pgqueuer 2p, {label}",
                f"drain-leaseq-adaptive-2p-{clock}",
                f"drain-pgqueuer-2p-{clock}",
            )
        )
    out.append(
        Ratio(
            "leaseq async 1p / pgqueuer psycopg driver (wall)",
            "drain-leaseq-wall",
            "drain-pgqueuer-psycopg-wall",
        )
    )
    out.append(
        Ratio(
            "leaseq async 1p / procrastinate (wall; N differs)",
            "drain-leaseq-wall",
            "drain-procrastinate-wall",
        )
    )
    return out


RATIOS = tuple(_ratios())
