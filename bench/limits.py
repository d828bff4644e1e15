"""Concurrency limits against none, in one run: the drain through the client.

    .venv/bin/python -m bench.limits [--dsn DSN] [--jobs 20000] [--batch 100] [--repeat 3]

Three schemas with the same N pending no-op jobs, each drained by claims of ``--batch``
jobs (a 100-slot worker's round), each batch completed with one fenced statement, until a
claim returns nothing:

- ``none``: no limit anywhere (the claim's plain path);
- ``generous``: ``queue:default`` with a concurrency far above what ever runs (every claim
  takes a slot per job, every completion gives them back; the limit is never reached);
- ``limit50``: ``queue:default`` at 50 on the 100-job rounds, so each claim is cut to the
  free slots.

Prints per-sample figures, their medians and the costs against ``none`` (issue 16's target:
a limit that is never reached costs at most 10% of the drain).
"""

from __future__ import annotations

import argparse
import statistics
import time

import leaseq
from bench.db import connect, fresh_schema, vacuum_analyze
from bench.harness import resolve_bench_dsn

MODES = {"none": None, "generous": 100_000, "limit50": 50}


def _fill(client: leaseq.Client, jobs: int) -> None:
    chunk = 1000
    for start in range(0, jobs, chunk):
        client.enqueue_many([{"task": "t"} for _ in range(start, min(start + chunk, jobs))])


def _drain(client: leaseq.Client, batch: int) -> tuple[int, float]:
    done = 0
    started = time.perf_counter()
    while leases := client.claim(worker="bench", limit=batch):
        done += len(client.complete_many(leases))
    return done, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", default=None, help="default: env LEASEQ_DSN, else embedded")
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    dsn = resolve_bench_dsn(args.dsn)
    drain: dict[str, list[float]] = {mode: [] for mode in MODES}
    for _ in range(args.repeat):
        for mode, concurrency in MODES.items():
            with fresh_schema(dsn, "limits") as client:
                _fill(client, args.jobs)
                if concurrency is not None:
                    client.set_limit("queue:default", concurrency=concurrency)
                with connect(dsn) as conn:
                    vacuum_analyze(conn, client.schema)
                done, took = _drain(client, args.batch)
                assert done == args.jobs, f"{mode}: drained {done} of {args.jobs}"
                drain[mode].append(args.jobs / took)
    print(
        f"{args.jobs:,} jobs drained by claims of {args.batch} + one fenced completion per "
        f"batch; {args.repeat} samples each"
    )
    med = {mode: statistics.median(v) for mode, v in drain.items()}
    for mode, values in drain.items():
        shown = ", ".join(f"{v:,.0f}" for v in values)
        print(f"drain {mode:9} {med[mode]:9,.0f} jobs/s (samples: {shown})")
    for mode in ("generous", "limit50"):
        print(f"drain cost {mode} / none: {med['none'] / med[mode]:.2f}x")


if __name__ == "__main__":
    main()
