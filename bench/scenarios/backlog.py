"""``workload-backlog``: the claim at a 1,000,000-job backlog (the largest ``--backlogs``
size), leaseq against the seed's minimal table (issue 35's realistic workloads).

For each system, on a table filled untimed with B pending jobs in one queue:
1. K claim (LIMIT 10) + fenced completion round trips on one connection, each followed by
   an untimed refill of what it completed, so the backlog stays B: the claim statement's
   p50 (ms, its commit included) and the round trips' rate;
2. then the whole backlog drained by 2 processes (``leaseq worker --burst --processes 2``;
   two ``bench.minimal`` processes at batch 100), timed on the two clocks. The drain's
   database clock starts at the first claim after step 1 (leaseq: ``started_at`` past a
   mark taken then; minimal: its processes' first claim).
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import psycopg
from psycopg import sql

from bench import minimal
from bench.db import (
    CLAIM_LIMIT,
    PENDING_ROWS,
    claim_and_complete,
    claim_params,
    connect,
    drop_schema,
    fresh_schema,
    insert_rows,
    jobs_table,
    new_schema_name,
    settle,
)
from bench.harness import (
    BenchError,
    Metric,
    Ratio,
    Sample,
    Scenario,
    Settings,
    leaseq_root,
    ms,
    percentile,
    run_burst_worker,
    run_processes,
    size_label,
    worker_env,
)
from bench.scenarios.drain import CLOCKS
from leaseq.sql import Queries

NAME = "workload-backlog"
PROCESSES = 2
MINIMAL_BATCH = 100
SYSTEMS = ("leaseq", "minimal")


def key(system: str, what: str) -> str:
    return f"wl-backlog-{system}-{what}"


def _now(conn: psycopg.Connection[Any]) -> float:
    row = conn.execute("SELECT extract(epoch FROM clock_timestamp())::float8").fetchone()
    assert row is not None
    return float(row[0])


def _claim_samples(system: str, claims: list[float], trips: list[float]) -> dict[str, Sample]:
    return {
        key(system, "claim"): Sample(len(claims), sum(claims), ms(percentile(claims, 50))),
        key(system, "trips"): Sample(len(trips), sum(trips)),
    }


def leaseq_backlog(settings: Settings, backlog: int) -> dict[str, Sample]:
    with fresh_schema(settings.dsn, NAME) as client:
        schema = client.schema
        queries = Queries(schema)
        claim, complete = queries["claim_jobs"], queries["complete_jobs"]
        params = claim_params(f"bench-backlog:{os.getpid()}", CLAIM_LIMIT)
        refill = sql.SQL(PENDING_ROWS).format(jobs_table(schema))
        claims: list[float] = []
        trips: list[float] = []
        with connect(settings.dsn) as conn:
            conn.execute("SET plan_cache_mode = force_generic_plan")  # as the worker's pool
            conn.execute("SET jit = off")
            insert_rows(conn, schema, PENDING_ROWS, backlog)
            settle(conn, schema, settings.checkpoint)
            for _ in range(settings.claims):
                t0 = time.perf_counter()
                n, claim_seconds = claim_and_complete(conn, claim, complete, params)
                trips.append(time.perf_counter() - t0)
                claims.append(claim_seconds)
                conn.execute(refill, (n,))
            mark = _now(conn)
        options = ("--processes", str(PROCESSES)) if PROCESSES > 1 else ()
        wall, lines = run_burst_worker(settings, schema, *options, cwd=leaseq_root())
        processed = sum(int(m["jobs"]) for m in lines)
        span = sql.SQL(
            "SELECT extract(epoch FROM min(started_at))::float8, "
            "extract(epoch FROM max(finished_at))::float8, count(*), "
            "count(*) FILTER (WHERE status <> 'succeeded') FROM {} "
            "WHERE started_at > to_timestamp(%s)"
        ).format(jobs_table(schema))
        with connect(settings.dsn) as conn:
            row = conn.execute(span, (mark,)).fetchone()
    if row is None or processed != backlog or row[2] != backlog or row[3] != 0:
        raise BenchError(f"{NAME}: leaseq drained {processed} of a {backlog} backlog ({row})")
    return {
        **_claim_samples("leaseq", claims, trips),
        key("leaseq", "db"): Sample(backlog, float(row[1]) - float(row[0])),
        key("leaseq", "wall"): Sample(backlog, wall),
    }


def minimal_backlog(settings: Settings, backlog: int) -> dict[str, Sample]:
    schema = new_schema_name(NAME)
    claim, complete = minimal._text(minimal.CLAIM, schema), minimal._text(minimal.COMPLETE, schema)
    refill = minimal._text(minimal.REFILL, schema)
    owner = f"bench-backlog-minimal:{os.getpid()}"
    params: dict[str, Any] = {"queue": minimal.QUEUE, "owner": owner, "limit": CLAIM_LIMIT}
    claims: list[float] = []
    trips: list[float] = []
    try:
        with connect(settings.dsn) as conn:
            conn.execute("SET jit = off")  # as bench.minimal's drain
            conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
            minimal.create(conn, schema)
            conn.execute(refill, (backlog,))
            settle(conn, schema, settings.checkpoint)
            for _ in range(settings.claims):
                t0 = time.perf_counter()
                rows = conn.execute(claim, params).fetchall()
                claims.append(time.perf_counter() - t0)
                fence = {
                    "ids": "{" + ",".join(str(r[0]) for r in rows) + "}",
                    "tokens": "{" + ",".join(str(r[1]) for r in rows) + "}",
                    "owner": owner,
                }
                done = conn.execute(complete, fence).rowcount
                trips.append(time.perf_counter() - t0)
                conn.execute(refill, (done,))
        command = [sys.executable, "-P", "-m", "bench.minimal"]
        command += ["--schema", schema, "--batch", str(MINIMAL_BATCH)]
        wall, outputs = run_processes([command] * PROCESSES, worker_env(settings.dsn, schema))
        lines = [json.loads(o.splitlines()[-1]) for o in outputs]
        processed = sum(int(line["processed"]) for line in lines)
        with connect(settings.dsn) as conn:
            row = conn.execute(
                minimal._text(
                    "SELECT extract(epoch FROM max(finished_at))::float8, "
                    "count(*) FILTER (WHERE status <> 'succeeded') FROM {schema}.jobs",
                    schema,
                )
            ).fetchone()
    finally:
        drop_schema(settings.dsn, schema)
    if row is None or row[0] is None or processed != backlog or row[1] != 0:
        raise BenchError(f"{NAME}: minimal drained {processed} of a {backlog} backlog")
    first = min(float(x["first_claim"]) for x in lines)
    return {
        **_claim_samples("minimal", claims, trips),
        key("minimal", "db"): Sample(backlog, float(row[0]) - first),
        key("minimal", "wall"): Sample(backlog, wall),
    }


def workload_backlog(settings: Settings) -> dict[str, Sample]:
    backlog = max(settings.backlogs)
    return {**leaseq_backlog(settings, backlog), **minimal_backlog(settings, backlog)}


def scenario(backlog: int) -> Scenario:
    size = size_label(backlog)
    what = {"leaseq": "leaseq", "minimal": "minimal"}
    metrics: list[Metric] = []
    for system in SYSTEMS:
        metrics += [
            Metric(
                key(system, "claim"),
                NAME,
                f"{what[system]} claim (LIMIT {CLAIM_LIMIT}) at backlog {size}, p50",
                "ms",
            ),
            Metric(
                key(system, "trips"),
                NAME,
                f"{what[system]} claim+complete at backlog {size}",
                "claims/s",
            ),
            *(
                Metric(
                    key(system, clock),
                    NAME,
                    f"{what[system]} {PROCESSES}p draining a {size} backlog, {label}",
                )
                for clock, label in CLOCKS.items()
            ),
        ]
    return Scenario(
        NAME,
        f"the claim and a {PROCESSES}-process drain at a {size}-job backlog, leaseq against "
        "the minimal table",
        tuple(metrics),
        workload_backlog,
    )


RATIOS = (
    Ratio(
        f"leaseq / minimal, claim statement p50 at the backlog (LIMIT {CLAIM_LIMIT})",
        key("leaseq", "claim"),
        key("minimal", "claim"),
    ),
    Ratio(
        "leaseq / minimal, claim+complete rate at the backlog",
        key("leaseq", "trips"),
        key("minimal", "trips"),
    ),
    *(
        Ratio(
            f"leaseq / minimal, {PROCESSES}p drain of the backlog, {label}",
            key("leaseq", clock),
            key("minimal", clock),
        )
        for clock, label in CLOCKS.items()
    ),
    Ratio(
        f"leaseq {PROCESSES}p drain, backlog / N-job drain, start-up excluded",
        key("leaseq", "db"),
        "drain-leaseq-2p-db",
    ),
)
