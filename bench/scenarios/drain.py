"""Drain scenarios: the raw-SQL drain limit (``drain-raw``), a real ``leaseq worker
--burst`` (``drain-leaseq``) and its two-process form (``drain-leaseq-2p``), with the
ratios that compare them."""

from __future__ import annotations

import os
import time

from bench.db import (
    check_drained,
    claim_and_complete,
    claim_params,
    connect,
    fill_queue,
    fresh_schema,
)
from bench.harness import (
    BenchError,
    Metric,
    Ratio,
    Sample,
    Scenario,
    Settings,
    leaseq_root,
    run_burst_worker,
)
from leaseq.sql import Queries


def drain_raw(settings: Settings) -> dict[str, Sample]:
    """One autocommit connection, leaseq's own claim_jobs and complete_jobs texts, no
    asyncio, no pool, no Lease objects: the floor under any worker built on these
    statements."""
    with fresh_schema(settings.dsn, "drain-raw") as client:
        fill_queue(settings.dsn, client, settings.jobs)
        queries = Queries(client.schema)
        claim, complete = queries["claim_jobs"], queries["complete_jobs"]
        params = claim_params(f"bench-raw:{os.getpid()}", settings.batch)
        done = 0
        with connect(settings.dsn) as conn:
            # The best this loop can do, as the worker does it: generic plans only (under
            # the default the claim is re-planned at every execution).
            conn.execute("SET plan_cache_mode = force_generic_plan")
            started = time.perf_counter()
            while n := claim_and_complete(conn, claim, complete, params)[0]:
                done += n
            elapsed = time.perf_counter() - started
        check_drained(settings.dsn, client.schema, settings.jobs)
    return {"drain-raw": Sample(done, elapsed)}


def drain_leaseq(settings: Settings) -> dict[str, Sample]:
    """A real ``leaseq worker --burst`` subprocess; wall time and the worker's own figure."""
    with fresh_schema(settings.dsn, "drain-leaseq") as client:
        fill_queue(settings.dsn, client, settings.jobs)
        wall, lines = run_burst_worker(settings, client.schema)
        match = lines[0]
        processed = int(match["jobs"])
        if processed != settings.jobs or int(match["succeeded"]) != settings.jobs:
            raise BenchError(f"worker processed {processed} of {settings.jobs}: {match[0]}")
        # The printed rate has more significant digits than the printed seconds.
        own_seconds = processed / float(match["rate"])
        check_drained(settings.dsn, client.schema, settings.jobs)
    return {
        "drain-leaseq-own": Sample(processed, own_seconds),
        "drain-leaseq-wall": Sample(processed, wall),
    }


def drain_leaseq_2p(settings: Settings) -> dict[str, Sample]:
    """``leaseq worker --burst --processes 2``: the supervisor and its two children, wall
    time only. Each child prints its own 'processed' line; together they must cover N."""
    with fresh_schema(settings.dsn, "drain-leaseq-2p") as client:
        fill_queue(settings.dsn, client, settings.jobs)
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
        check_drained(settings.dsn, client.schema, settings.jobs)
    return {"drain-leaseq-2p-wall": Sample(processed, wall)}


RAW = Scenario(
    "drain-raw",
    "raw-SQL drain limit: claim_jobs + complete_jobs in a loop on one connection",
    (Metric("drain-raw", "drain-raw", "claim_jobs+complete_jobs loop, 1 conn"),),
    drain_raw,
)
LEASEQ = Scenario(
    "drain-leaseq",
    "`leaseq worker --burst` subprocess draining the same N no-op jobs",
    (
        Metric("drain-leaseq-wall", "drain-leaseq", "worker, wall (startup included)"),
        Metric("drain-leaseq-own", "drain-leaseq", "worker, its own figure (startup excluded)"),
    ),
    drain_leaseq,
)
TWO_PROCESSES = Scenario(
    "drain-leaseq-2p",
    "`leaseq worker --burst --processes 2` draining the same N no-op jobs",
    (Metric("drain-leaseq-2p-wall", "drain-leaseq-2p", "--processes 2, wall (startup included)"),),
    drain_leaseq_2p,
)

RATIOS = (
    Ratio(
        "leaseq drain / raw drain (worker's own figure; target >= 0.65)",
        "drain-leaseq-own",
        "drain-raw",
    ),
    Ratio("leaseq drain / raw drain (wall, startup included)", "drain-leaseq-wall", "drain-raw"),
    Ratio(
        "leaseq drain, 2 processes / 1 process (wall)",
        "drain-leaseq-2p-wall",
        "drain-leaseq-wall",
    ),
)
