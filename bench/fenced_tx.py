"""Cost of a fenced transactional completion against a plain one, in one run.

    .venv/bin/python -m bench.fenced_tx [--dsn DSN] [--jobs 5000] [--repeat 3]

Three drains of N jobs by an in-process worker (concurrency 64): handlers that do nothing
(plain fenced completion), handlers that insert one row on their own autocommit connection
and then complete (the usual, non-atomic way), and handlers that insert the row inside
``ctx.transaction()`` so it commits with the completion. Prints jobs/s medians and ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

import psycopg
from psycopg import sql

import leaseq
from bench.db import connect, fresh_schema
from bench.harness import resolve_bench_dsn


async def _drain(dsn: str, schema: str, mode: str, jobs: int) -> float:
    app = leaseq.App(dsn, schema=schema)
    insert = sql.SQL("INSERT INTO {}.ledger VALUES (%s)").format(sql.Identifier(schema))
    pool: list[psycopg.AsyncConnection[Any]] = []

    @app.task(name="work")
    async def work(ctx: leaseq.JobContext, payload: Any) -> None:
        if mode == "plain":
            return
        if mode == "separate":
            conn = (
                pool.pop() if pool else await psycopg.AsyncConnection.connect(dsn, autocommit=True)
            )
            await conn.execute(insert, (ctx.job_id,))
            pool.append(conn)
            return
        async with ctx.transaction() as conn:
            await conn.execute(insert, (ctx.job_id,))

    app.client.enqueue_many([{"task": "work"}] * jobs)
    config = leaseq.WorkerConfig(concurrency=64, batch_size=32, burst=True, poll_interval=0.05)
    started = time.perf_counter()
    stats = await leaseq.Worker(app, config).run()
    elapsed = time.perf_counter() - started
    for conn in pool:
        await conn.close()
    app.close()
    assert stats.succeeded == jobs, stats
    return jobs / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", default=None, help="default: env LEASEQ_DSN, else embedded")
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    dsn = resolve_bench_dsn(args.dsn)
    results: dict[str, list[float]] = {"plain": [], "separate": [], "fenced": []}
    for _ in range(args.repeat):
        for mode in results:
            with fresh_schema(dsn, "tx") as client:
                ledger = sql.SQL("CREATE TABLE {}.ledger (job_id bigint)")
                with connect(dsn) as conn:
                    conn.execute(ledger.format(sql.Identifier(client.schema)))
                results[mode].append(asyncio.run(_drain(dsn, client.schema, mode, args.jobs)))
    med = {mode: statistics.median(v) for mode, v in results.items()}
    for mode, values in results.items():
        print(f"{mode:9} {med[mode]:8.0f} jobs/s  (min {min(values):.0f}, max {max(values):.0f})")
    print(f"fenced transaction / plain completion:  {med['fenced'] / med['plain']:.2f}")
    print(f"fenced transaction / separate insert:   {med['fenced'] / med['separate']:.2f}")


if __name__ == "__main__":
    main()
