"""graphile-worker 0.17 (Node.js) as a peer (issue 35): ``drain-graphile-batched-2p`` /
``-4p`` and ``drain-graphile-default-2p`` / ``-4p``, opt-in (``--only 'drain-graphile-*'``;
they need ``cd bench/peers/graphile && npm ci`` and Node.js 18 or later).

Each sample creates graphile-worker's schema with its own ``runMigrations`` (in a schema of
its own), enqueues N no-op jobs with its own ``add_jobs`` SQL function (untimed, in chunks),
then starts P ``node bench/peers/graphile/run.js drain`` processes at once, each running
``runOnce`` with a no-op task: in the **batched** mode, at concurrency C (``--concurrency``)
with a local queue of 500 jobs per process and completions and failures batched (delay 0),
graphile's high-throughput configuration; in the **default** mode without either, at
concurrency 24 with a pool of 26 (a connection per running job). A finished
job is deleted by graphile-worker, so the check is that the jobs table is empty and every
handler ran once. Clocks: *start-up excluded* from the first handler call in any process to
the last process's return from ``runOnce`` (after its batched completions were written);
*process wall* from spawn to exit, as for every other system.
"""

from __future__ import annotations

import json
import os
import shutil
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
    ScenarioUnavailable,
    Settings,
    run_processes,
)

PEER_DIR = REPO_ROOT / "bench" / "peers" / "graphile"
LOCAL_QUEUE = 500
ADD_CHUNK = 5000
MODES = ("batched", "default")
PROCESSES = (2, 4)
DEFAULT_MODE_CONCURRENCY = 24


def _env(settings: Settings, schema: str, mode: str) -> dict[str, str]:
    env = dict(os.environ)
    env["LEASEQ_DSN"] = settings.dsn  # by env, not argv
    env["GRAPHILE_SCHEMA"] = schema
    # The default mode takes a pool connection per running job: at the bench's concurrency
    # (200 per process) 4 processes would pass max_connections, so it runs at 24, the
    # concurrency of graphile-worker's own performance test, with a pool to match.
    concurrency = settings.concurrency if mode == "batched" else DEFAULT_MODE_CONCURRENCY
    env["GRAPHILE_CONCURRENCY"] = str(concurrency)
    env["GRAPHILE_BATCHED"] = "1" if mode == "batched" else "0"
    env["GRAPHILE_LOCAL_QUEUE"] = str(LOCAL_QUEUE)
    return env


def _require() -> str:
    node = shutil.which("node")
    if node is None:
        raise ScenarioUnavailable("node not installed (Debian: apt-get install nodejs)")
    if not (PEER_DIR / "node_modules" / "graphile-worker").is_dir():
        raise ScenarioUnavailable(
            "graphile-worker not installed (cd bench/peers/graphile && npm ci)"
        )
    return node


def _fill(settings: Settings, schema: str) -> None:
    add = sql.SQL(
        "SELECT {}.add_jobs(array_agg(ROW('noop', json_build_object('n', g), NULL, NULL, NULL, "
        "NULL, NULL, NULL)::{}.job_spec)) FROM generate_series(%s::int, %s::int) AS g"
    ).format(sql.Identifier(schema), sql.Identifier(schema))
    with connect(settings.dsn) as conn:
        for start in range(1, settings.jobs + 1, ADD_CHUNK):
            conn.execute(add, (start, min(settings.jobs, start + ADD_CHUNK - 1)))
        conn.execute(sql.SQL("VACUUM (ANALYZE) {}._private_jobs").format(sql.Identifier(schema)))


def _left(settings: Settings, schema: str) -> int:
    with connect(settings.dsn) as conn:
        row = conn.execute(
            sql.SQL("SELECT count(*) FROM {}._private_jobs").format(sql.Identifier(schema))
        ).fetchone()
    return int(row[0]) if row else -1


def drain_graphile(settings: Settings, mode: str, processes: int) -> dict[str, Sample]:
    node = _require()
    name = f"drain-graphile-{mode}-{processes}p"
    with empty_schema(settings.dsn, "drain-graphile") as base:
        schema = f"{base}_gw"  # graphile-worker creates its schema itself
        try:
            env = _env(settings, schema, mode)
            run_processes([[node, "run.js", "migrate"]], env, PEER_DIR)
            _fill(settings, schema)
            wall, outputs = run_processes([[node, "run.js", "drain"]] * processes, env, PEER_DIR)
            reports: list[dict[str, Any]] = []
            for out in outputs:
                try:
                    reports.append(json.loads(out.strip().splitlines()[-1]))
                except (IndexError, ValueError):
                    raise BenchError(f"graphile drain printed no report: {out[-2000:]!r}") from None
            processed = sum(int(r["processed"]) for r in reports)
            if processed != settings.jobs or _left(settings, schema) != 0:
                raise BenchError(f"graphile-worker ran {processed} handlers for {settings.jobs}")
            starts = [float(r["first_start"]) for r in reports if r["first_start"] is not None]
            own = (max(float(r["end"]) for r in reports) - min(starts)) / 1000.0
        finally:
            with connect(settings.dsn) as conn:
                conn.execute(
                    sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema))
                )
    return {f"{name}-db": Sample(processed, own), f"{name}-wall": Sample(processed, wall)}


def _scenario(mode: str, processes: int) -> Scenario:
    name = f"drain-graphile-{mode}-{processes}p"
    what = (
        f"local queue {LOCAL_QUEUE}, batched completions" if mode == "batched" else "default mode"
    )

    def fn(settings: Settings) -> dict[str, Sample]:
        return drain_graphile(settings, mode, processes)

    return Scenario(
        name,
        f"graphile-worker 0.17 ({what}), {processes} processes, draining the same N no-op jobs",
        (
            Metric(f"{name}-db", name, f"graphile-worker {mode}, {processes}p, start-up excluded"),
            Metric(f"{name}-wall", name, f"graphile-worker {mode}, {processes}p, process wall"),
        ),
        fn,
        default=False,
    )


SCENARIOS = tuple(_scenario(m, p) for m in MODES for p in PROCESSES)

RATIOS = tuple(
    Ratio(
        f"leaseq async 2p{flag} / graphile-worker {mode} 2p, {label}"
        + (" (target >= 1)" if mode == "batched" and clock == "db" and not flag else ""),
        f"drain-leaseq{scenario}-2p-{clock}",
        f"drain-graphile-{mode}-2p-{clock}",
    )
    # leaseq's batched mode (--adaptive-batch) beside graphile-worker's batched mode too.
    for scenario, flag in (("", ""), ("-adaptive", " --adaptive-batch"))
    for mode in MODES
    for clock, label in (("db", "start-up excluded"), ("wall", "process wall"))
)
