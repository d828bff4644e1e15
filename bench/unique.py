"""Unique keys against none, in one run: the drain and single enqueues.

    .venv/bin/python -m bench.unique [--dsn DSN] [--jobs 20000] [--single 2000] [--repeat 3]

Two schemas with the same N pending no-op jobs: one without unique keys, one with a
distinct unique key on every job (the keys are taken, then released by each completion in
the same statement). Each is drained through the client: claims of ``--batch`` jobs, each
batch completed with one fenced statement (the keyed one for keyed leases), until a claim
returns nothing. Single enqueues: ``--single`` ``Client.enqueue`` calls, with and without a
(distinct) key. Prints per-sample figures, their medians and the ratios keyed / plain
(issue 14's target: at most 1.15x for the drain).
"""

from __future__ import annotations

import argparse
import statistics
import time

import leaseq
from bench.db import connect, fresh_schema, vacuum_analyze
from bench.harness import resolve_bench_dsn

MODES = ("plain", "unique")


def _fill(client: leaseq.Client, jobs: int, keyed: bool) -> None:
    chunk = 1000
    for start in range(0, jobs, chunk):
        client.enqueue_many(
            [
                {"task": "t", "unique_key": f"u{i}" if keyed else None}
                for i in range(start, min(start + chunk, jobs))
            ]
        )


def _drain(client: leaseq.Client, batch: int) -> tuple[int, float]:
    done = 0
    started = time.perf_counter()
    while leases := client.claim(worker="bench", limit=batch):
        done += len(client.complete_many(leases))
    return done, time.perf_counter() - started


def _enqueue(client: leaseq.Client, count: int, keyed: bool) -> float:
    started = time.perf_counter()
    for i in range(count):
        client.enqueue("t", unique_key=f"s{i}" if keyed else None)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", default=None, help="default: env LEASEQ_DSN, else embedded")
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--single", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    dsn = resolve_bench_dsn(args.dsn)
    drain: dict[str, list[float]] = {mode: [] for mode in MODES}
    single: dict[str, list[float]] = {mode: [] for mode in MODES}
    for _ in range(args.repeat):
        for mode in MODES:
            keyed = mode == "unique"
            with fresh_schema(dsn, "unique") as client:
                _fill(client, args.jobs, keyed)
                with connect(dsn) as conn:
                    vacuum_analyze(conn, client.schema)
                done, took = _drain(client, args.batch)
                assert done == args.jobs, f"{mode}: drained {done} of {args.jobs}"
                drain[mode].append(args.jobs / took)
            with fresh_schema(dsn, "unique") as client:
                single[mode].append(args.single / _enqueue(client, args.single, keyed))
    print(
        f"{args.jobs:,} jobs drained by claims of {args.batch} + one fenced completion per "
        f"batch; {args.single:,} single enqueues; {args.repeat} samples each"
    )
    for title, figures in (("drain", drain), ("enqueue", single)):
        med = {mode: statistics.median(v) for mode, v in figures.items()}
        for mode, values in figures.items():
            shown = ", ".join(f"{v:,.0f}" for v in values)
            print(f"{title:8} {mode:7} {med[mode]:9,.0f} jobs/s (samples: {shown})")
        print(f"{title:8} cost unique / plain: {med['plain'] / med['unique']:.2f}x")


if __name__ == "__main__":
    main()
