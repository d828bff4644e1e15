"""Durable execution's costs (docs/durable.md), each as a ratio measured in one run:

    .venv/bin/python -m bench.durable [--dsn DSN] [--jobs 2000] [--sleeping 100000]
                                      [--due 10000] [--claims 500] [--repeat 3]

1. steps: a worker (concurrency 10) drains ``--jobs`` jobs of an async task with three
   no-op steps (``ctx.step_async``), against the same number of no-op jobs; the ratio of
   the rates (target: at least 0.33). Also the same three steps from a sync handler
   (``ctx.step``, run in the worker's handler threads).
2. sleeping: the plain claim statement (claim_jobs, LIMIT 10, prepared, rolled back: no
   commit flush in the clock) on a 20,000-job backlog with ``--sleeping`` suspended jobs
   of the same queue sleeping for a day, against none, alternating on one connection
   (target: at most 1.05). They hold no lease, slot or connection: the claim's only extra
   work is the probe of jobs_wake_idx for due ones.
3. wake-up: a worker drains ``--due`` suspended jobs all due at once (woken by its claims)
   against the same number of pending jobs (target: at most 2.0).

Modes alternate within each repeat; medians are printed.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

import leaseq
from bench.db import (
    PENDING_ROWS,
    check_drained,
    connect,
    fresh_schema,
    insert_rows,
    vacuum_analyze,
)
from bench.harness import resolve_bench_dsn

SUSPENDED_ROWS = """
INSERT INTO {} (queue_name, task, payload, status, suspend_reason, wake_at)
SELECT 'default', 'noop', jsonb_build_object('n', g), 'suspended', 'sleep', now() + %s::interval
FROM generate_series(1, %s::int) AS g
"""


def _app(dsn: str, client: leaseq.Client) -> leaseq.App:
    app = leaseq.App(dsn, schema=client.schema)

    async def nothing() -> None:
        return None

    @app.task(name="noop")
    async def noop(ctx: leaseq.JobContext, payload: Any) -> None:
        return None

    @app.task(name="three_steps")
    async def three_steps(ctx: leaseq.JobContext, payload: Any) -> None:
        for name in ("a", "b", "c"):
            await ctx.step_async(name, nothing)

    @app.task(name="three_steps_sync")
    def three_steps_sync(ctx: leaseq.JobContext, payload: Any) -> None:
        for name in ("a", "b", "c"):
            ctx.step(name, lambda: None)

    return app


def _drain(app: leaseq.App) -> float:
    config = leaseq.WorkerConfig(concurrency=10, drain=True, poll_interval=0.05)
    started = time.perf_counter()
    stats = asyncio.run(leaseq.Worker(app, config).run())
    took = time.perf_counter() - started
    if stats.failed:
        raise SystemExit(f"{stats.failed} job(s) failed in the drain")
    return took


def _suspended(dsn: str, client: leaseq.Client, count: int, wake_in: str) -> None:
    with connect(dsn) as conn:
        table = f'"{client.schema}".jobs'
        conn.execute(SUSPENDED_ROWS.replace("{}", table), (wake_in, count))
        vacuum_analyze(conn, client.schema)


def steps_rate(dsn: str, jobs: int) -> dict[str, float]:
    rates: dict[str, float] = {}
    for task in ("noop", "three_steps", "three_steps_sync"):
        with fresh_schema(dsn, "durable_steps") as client:
            client.enqueue_many(leaseq.JobSpec(task, {"n": n}) for n in range(jobs))
            with connect(dsn) as conn:
                vacuum_analyze(conn, client.schema)
            rates[task] = jobs / _drain(_app(dsn, client))
            check_drained(dsn, client.schema, jobs)
    return rates


def sleeping_claims(dsn: str, sleeping: int, claims: int) -> dict[str, float]:
    """Median seconds of the bare claim_jobs statement (prepared, LIMIT 10, rolled back so
    no commit's flush is timed) on a 20,000-job backlog, with and without the sleepers,
    the two schemas alternating on one connection so that the load drifts alike."""
    params = {"queue": "default", "owner": "bench", "lease_seconds": 60.0, "limit": 10}
    with (
        fresh_schema(dsn, "durable_sleep") as plain,
        fresh_schema(dsn, "durable_sleep") as slept,
        connect(dsn) as conn,
    ):
        for client in (plain, slept):
            insert_rows(conn, client.schema, PENDING_ROWS, 20_000)
            vacuum_analyze(conn, client.schema)
        _suspended(dsn, slept, sleeping, "1 day")
        texts = {"none": plain.queries["claim_jobs"], "sleeping": slept.queries["claim_jobs"]}
        took: dict[str, list[float]] = {mode: [] for mode in texts}
        for i in range(claims + 50):
            for mode in sorted(texts, reverse=bool(i % 2)):
                with conn.transaction(force_rollback=True):
                    started = time.perf_counter()
                    got = conn.execute(texts[mode], params, prepare=True).fetchall()
                    if i >= 50:  # the first runs warm the plan cache
                        took[mode].append(time.perf_counter() - started)
                if len(got) != 10:
                    raise SystemExit(f"claimed {len(got)} jobs, expected 10")
        return {mode: statistics.median(values) for mode, values in took.items()}


def wakeup(dsn: str, due: int) -> dict[str, float]:
    out: dict[str, float] = {}
    for mode in ("pending", "due"):
        with fresh_schema(dsn, "durable_wake") as client:
            if mode == "pending":
                with connect(dsn) as conn:
                    insert_rows(conn, client.schema, PENDING_ROWS, due)
                    vacuum_analyze(conn, client.schema)
            else:
                _suspended(dsn, client, due, "-1 second")
            out[mode] = _drain(_app(dsn, client))
            check_drained(dsn, client.schema, due)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--dsn", default=None, help="default: env LEASEQ_DSN, else embedded")
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--sleeping", type=int, default=100_000)
    parser.add_argument("--due", type=int, default=10_000)
    parser.add_argument("--claims", type=int, default=500)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--only", choices=["steps", "sleeping", "wakeup"], default=None)
    args = parser.parse_args()
    dsn = resolve_bench_dsn(args.dsn)
    runs: dict[str, list[dict[str, float]]] = {"steps": [], "sleeping": [], "wakeup": []}
    for _ in range(args.repeat):
        if args.only in (None, "steps"):
            runs["steps"].append(steps_rate(dsn, args.jobs))
        if args.only in (None, "sleeping"):
            runs["sleeping"].append(sleeping_claims(dsn, args.sleeping, args.claims))
        if args.only in (None, "wakeup"):
            runs["wakeup"].append(wakeup(dsn, args.due))

    def med(name: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[name])

    if runs["steps"]:
        noop, steps = med("steps", "noop"), med("steps", "three_steps")
        sync = med("steps", "three_steps_sync")
        print(
            f"steps: {args.jobs:,} jobs, concurrency 10: no-op {noop:,.0f} jobs/s, "
            f"3 no-op steps {steps:,.0f} jobs/s, ratio {steps / noop:.2f} (target >= 0.33); "
            f"the same from a sync handler {sync:,.0f} jobs/s, ratio {sync / noop:.2f}"
        )
    if runs["sleeping"]:
        none, sleeping = med("sleeping", "none"), med("sleeping", "sleeping")
        print(
            f"sleeping: claim statement, 10 of 20,000 pending, median {none * 1e3:.3f} ms without, "
            f"{sleeping * 1e3:.3f} ms with {args.sleeping:,} sleeping jobs in the queue, "
            f"ratio {sleeping / none:.3f} (target <= 1.05)"
        )
    if runs["wakeup"]:
        pending, due = med("wakeup", "pending"), med("wakeup", "due")
        print(
            f"wakeup: drain of {args.due:,} pending {pending:.2f} s, of {args.due:,} suspended "
            f"due at once {due:.2f} s, ratio {due / pending:.2f} (target <= 2.0)"
        )
    print(f"({args.repeat} repeat(s), medians; modes alternate within each repeat)")


if __name__ == "__main__":
    main()
