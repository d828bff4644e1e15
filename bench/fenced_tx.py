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
import os
import statistics
import time
import uuid
from typing import Any

import psycopg
from psycopg import sql

import leaseq


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
    parser.add_argument("--dsn", default=os.environ.get("LEASEQ_DSN"))
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    dsn = args.dsn or __import__("leaseq.dev.embedded").dev.embedded.embedded_dsn()
    results: dict[str, list[float]] = {"plain": [], "separate": [], "fenced": []}
    for _ in range(args.repeat):
        for mode in results:
            schema = f"bench_tx_{uuid.uuid4().hex[:8]}"
            client = leaseq.Client(dsn, schema=schema)
            client.migrate()
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(
                    sql.SQL("CREATE TABLE {}.ledger (job_id bigint)").format(sql.Identifier(schema))
                )
            try:
                results[mode].append(asyncio.run(_drain(dsn, schema, mode, args.jobs)))
            finally:
                client.close()
                with psycopg.connect(dsn, autocommit=True) as conn:
                    conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))
    med = {mode: statistics.median(v) for mode, v in results.items()}
    for mode, values in results.items():
        print(f"{mode:9} {med[mode]:8.0f} jobs/s  (min {min(values):.0f}, max {max(values):.0f})")
    print(f"fenced transaction / plain completion:  {med['fenced'] / med['plain']:.2f}")
    print(f"fenced transaction / separate insert:   {med['fenced'] / med['separate']:.2f}")


if __name__ == "__main__":
    main()
