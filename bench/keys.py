"""Claim cost with ordering keys against without, at the same backlog, in one run.

    .venv/bin/python -m bench.keys [--dsn DSN] [--pending 100000] [--keys 10000] [--claims 2000]

Two schemas with the same number of pending jobs: one keyless, one spread over K ordering
keys (so only K heads are claimable and the rest wait, blocked). Each times ``--claims``
rounds of one claim (LIMIT 10) plus its completion (which, with keys, also unblocks the next
job of each key in the same transaction), through the client. Prints per-round medians and
the ratio keyed / keyless.
"""

from __future__ import annotations

import argparse
import statistics
import time

import leaseq
from bench.db import connect, fresh_schema, vacuum_analyze
from bench.harness import resolve_bench_dsn


def _fill(client: leaseq.Client, pending: int, keys: int | None) -> None:
    chunk = 10_000
    for start in range(0, pending, chunk):
        client.enqueue_many(
            [
                {"task": "t", "ordering_key": None if keys is None else f"k{i % keys}"}
                for i in range(start, min(start + chunk, pending))
            ]
        )


def _time_claims(client: leaseq.Client, claims: int) -> list[float]:
    took = []
    for _ in range(claims):
        started = time.perf_counter()
        leases = client.claim(worker="bench", limit=10)
        client.complete_many(leases)
        took.append(time.perf_counter() - started)
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", default=None, help="default: env LEASEQ_DSN, else embedded")
    parser.add_argument("--pending", type=int, default=100_000)
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--claims", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    dsn = resolve_bench_dsn(args.dsn)
    results: dict[str, list[float]] = {"keyless": [], "keyed": []}
    for _ in range(args.repeat):
        for mode in results:
            with fresh_schema(dsn, "keys") as client:
                _fill(client, args.pending, args.keys if mode == "keyed" else None)
                with connect(dsn) as conn:
                    vacuum_analyze(conn, client.schema)
                took = _time_claims(client, args.claims)
                results[mode].append(statistics.mean(took))
    med = {mode: statistics.median(v) for mode, v in results.items()}
    print(
        f"{args.pending:,} pending; keyed: over {args.keys:,} ordering keys; "
        f"{args.claims:,} claims of 10 + completions per sample"
    )
    for mode, values in results.items():
        print(
            f"{mode:8} {med[mode] * 1000:6.2f} ms per claim+complete "
            f"(min {min(values) * 1000:.2f}, max {max(values) * 1000:.2f})"
        )
    print(f"keyed / keyless: {med['keyed'] / med['keyless']:.2f}")


if __name__ == "__main__":
    main()
