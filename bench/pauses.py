"""Claim cost with 100 pauses of other scopes present against none, at the same backlog.

    .venv/bin/python -m bench.pauses [--dsn DSN] [--pending 20000] [--claims 1000] [--repeat 3]

Two schemas with the same pending no-op jobs in queue ``default``: one with no pause, one
with 100 pauses that hold none of these jobs (34 other queues, 33 other tasks, 33 ordering
keys). The task pauses switch on the per-candidate probe of the claim's pause check, so this
is its worst case short of holding the jobs themselves. Each sample times ``--claims`` claim
statements (LIMIT 10) through the client; the completions run outside the clock. Prints the
per-claim medians and the ratio with pauses / without (target: at most 1.15).

Then what the pause check itself costs: on one connection, the bare ``claim_jobs`` statement
(prepared) against the same text without the check, alternating, first with no pause, then
with the 100 pauses. The statement alone is the smallest denominator there is; a worker's
claim round trip (pool, decoding, completion) dilutes the difference.
"""

from __future__ import annotations

import argparse
import statistics
import time

import leaseq
from bench.db import PENDING_ROWS, connect, fresh_schema, insert_rows, vacuum_analyze
from bench.harness import resolve_bench_dsn

PAUSES = 100


def _pause_others(client: leaseq.Client) -> None:
    for i in range(PAUSES):
        if i % 3 == 0:
            client.pause(f"other-{i}", reason="bench")
        elif i % 3 == 1:
            client.pause(task=f"other.task-{i}", reason="bench")
        else:
            client.pause(ordering_key=f"other-key-{i}", reason="bench")


def _time_claims(client: leaseq.Client, claims: int) -> list[float]:
    took = []
    for _ in range(claims):
        started = time.perf_counter()
        leases = client.claim(worker="bench", limit=10)
        took.append(time.perf_counter() - started)
        if len(leases) != 10:
            raise SystemExit(f"claimed {len(leases)} jobs, expected 10: raise --pending")
        client.complete_many(leases)
    return took


def _unchecked(claim: str) -> str:
    """claim_jobs without its pause check (the _not_paused fragment)."""
    start = claim.index("AND NOT EXISTS (SELECT 1 FROM")
    end = claim.index("ORDER BY priority DESC")
    text = claim[:start] + claim[end:]
    if ".pauses " in text or ".pauses " not in claim[start:end]:
        raise SystemExit("claim_jobs changed shape: update bench/pauses.py")
    return text


def _statement_cost(dsn: str, pending: int, claims: int) -> dict[str, float]:
    """Median seconds of the bare claim statement, with and without the check, alternating."""
    out: dict[str, float] = {}
    with fresh_schema(dsn, "pauses_sql") as client, connect(dsn) as conn:
        insert_rows(conn, client.schema, PENDING_ROWS, 4 * claims * 10 + pending)
        vacuum_analyze(conn, client.schema)
        texts = {"checked": client.queries["claim_jobs"]}
        texts["unchecked"] = _unchecked(texts["checked"])
        params = {
            "queue": "default",
            "owner": "bench",
            "lease_seconds": 60.0,
            "limit": 10,
        }
        for phase in ("none", "100 pauses"):
            if phase != "none":
                _pause_others(client)
                conn.execute(f'ANALYZE "{client.schema}".pauses')
            took: dict[str, list[float]] = {name: [] for name in texts}
            for i in range(claims + 50):
                for name in sorted(texts, reverse=bool(i % 2)):
                    started = time.perf_counter()
                    got = conn.execute(texts[name], params, prepare=True).fetchall()
                    if i >= 50:  # the first runs warm the plan cache
                        took[name].append(time.perf_counter() - started)
                    if len(got) != 10:
                        raise SystemExit("ran out of pending jobs")
            for name, values in took.items():
                out[f"{name}, {phase}"] = statistics.median(values)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--dsn", default=None, help="default: env LEASEQ_DSN, else embedded")
    parser.add_argument("--pending", type=int, default=20_000)
    parser.add_argument("--claims", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    dsn = resolve_bench_dsn(args.dsn)
    results: dict[str, list[float]] = {"none": [], "100 pauses": []}
    for _ in range(args.repeat):
        for mode in results:
            with fresh_schema(dsn, "pauses") as client:
                with connect(dsn) as conn:
                    insert_rows(conn, client.schema, PENDING_ROWS, args.pending)
                    vacuum_analyze(conn, client.schema)
                if mode != "none":
                    _pause_others(client)
                    with connect(dsn) as conn:
                        conn.execute(f'ANALYZE "{client.schema}".pauses')
                client.claim(worker="bench", limit=1)  # warm the pool and the plan cache
                results[mode].append(statistics.median(_time_claims(client, args.claims)))
    med = {mode: statistics.median(v) for mode, v in results.items()}
    print(
        f"{args.pending:,} pending jobs; {args.claims:,} claims of 10 per sample, "
        f"{args.repeat} sample(s) per mode"
    )
    for mode, values in results.items():
        print(
            f"{mode:11} {med[mode] * 1000:6.3f} ms per claim "
            f"(samples: {', '.join(f'{v * 1000:.3f}' for v in values)})"
        )
    print(f"100 pauses / none: {med['100 pauses'] / med['none']:.3f} (target <= 1.15)")
    cost = _statement_cost(dsn, args.pending, args.claims)
    print("the bare claim_jobs statement (LIMIT 10, prepared), with / without the pause check:")
    for phase in ("none", "100 pauses"):
        checked, unchecked = cost[f"checked, {phase}"], cost[f"unchecked, {phase}"]
        print(
            f"  {phase:11} {checked * 1000:6.3f} ms / {unchecked * 1000:6.3f} ms "
            f"= {checked / unchecked:.3f}"
        )


if __name__ == "__main__":
    main()
