"""Fair dispatch's cost: a drain of a fair queue with 10,000 keys against the plain drain of
the same number of keyless jobs, and the plain claim statement against the same statement
without the fair-queue check (the claim as it was before fairness keys), interleaved.

    .venv/bin/python -m bench.fairness [--dsn DSN] [--jobs 40000] [--keys 10000] [--repeat 3]
        [--worker C]

With ``--worker C`` the same two drains are also run by a real ``leaseq worker --burst``
process at concurrency C (claims of at most C), interleaved the same way, with the ratio
of each round: what a user's worker sees, handler cycle and completions included.

Drain: two schemas per round, filled the same way (``--jobs`` no-op jobs, untimed), one
with every job under one of ``--keys`` fairness keys (round robin), one without keys; each
drained by one client claiming 10 at a time (``claim`` + ``complete_many``, the work of a
worker at concurrency 10 without the handler), configured as a worker's (generic plans),
with the worker's vacuum of ``fair_keys`` every half second (``vacuum_fair_keys``).
Rounds alternate the order of the two modes. Prints jobs/s per mode per round, the
medians and the ratio fair / plain (target >= 0.85).

Counts: the fair claim statement on ``--keys`` keys of 5 jobs each and the plain one on
as many keyless jobs, 200 claims each: shared buffers read and WAL bytes per claim of 10
(pg_stat_database and the WAL position around each claim; PostgreSQL 15+, and the server
must have nothing else running). Counts, not times: they hold on a busy machine.

Trigger: the same bare ``claim_jobs`` with migration 29's ``jobs_fair_ready`` trigger and
without it, in alternating blocks of 50 claims (its WHEN clause is evaluated for every row a
claim updates).

Statement: on one connection, the bare ``claim_jobs`` (prepared) of a queue without keys
against the same text without its ``_queue_is_fair`` check, alternating claim by claim
(target: at most 1.03).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import time
from typing import Any

from psycopg import sql

import leaseq
from bench.db import PENDING_ROWS, connect, fresh_schema, insert_rows, vacuum_analyze
from bench.harness import (
    REPO_ROOT,
    WORKER_LINE,
    resolve_bench_dsn,
    worker_command,
    worker_env,
)
from leaseq.worker.maintenance import FAIR_VACUUM_DEAD, FAIR_VACUUM_EVERY


def _fill(dsn: str, client: leaseq.Client, jobs: int, keys: int) -> None:
    if keys == 0:
        with connect(dsn) as conn:
            insert_rows(conn, client.schema, PENDING_ROWS, jobs)
    else:
        for start in range(0, jobs, 10_000):
            n = min(10_000, jobs - start)
            client.enqueue_many(
                [{"task": "noop", "fairness_key": f"k{(start + i) % keys}"} for i in range(n)]
            )
    with connect(dsn) as conn:
        vacuum_analyze(conn, client.schema)


def _drain(dsn: str, client: leaseq.Client, jobs: int) -> float:
    """Claims of 10 and their completions, and every half second what a worker's FairKeyVacuum
    does (on a connection of its own, as the worker's): timed together."""
    done = 0
    with connect(dsn) as own:
        own.autocommit = True
        started = look = time.perf_counter()
        while leases := client.claim(worker="bench", limit=10):
            client.complete_many(leases)
            done += len(leases)
            if time.perf_counter() - look >= FAIR_VACUUM_EVERY:
                client.vacuum_fair_keys(min_dead=FAIR_VACUUM_DEAD, connection=own)
                look = time.perf_counter()
        took = time.perf_counter() - started
    if done != jobs:
        raise SystemExit(f"drained {done} of {jobs} jobs")
    return done / took


def _worker_drain(dsn: str, schema: str, jobs: int, concurrency: int) -> float:
    """The same drain by a real ``leaseq worker --burst`` process (the no-op async task of
    bench.apps, claims of at most ``concurrency``): jobs/s as the worker reports them."""
    command = worker_command(
        "--burst", "--concurrency", str(concurrency), "--batch-size", str(concurrency)
    )
    proc = subprocess.run(
        command, cwd=REPO_ROOT, env=worker_env(dsn, schema), capture_output=True, text=True
    )
    found = list(WORKER_LINE.finditer(proc.stdout))
    if proc.returncode != 0 or not found:
        raise SystemExit(f"worker failed ({proc.returncode}): {proc.stderr.strip()[-500:]}")
    line = found[-1]
    if int(line["succeeded"]) != jobs:
        raise SystemExit(f"the worker drained {line['succeeded']} of {jobs} jobs")
    return float(line["rate"])


def _without_fair_check(claim: str) -> str:
    start = claim.rindex("WHEN EXISTS", 0, claim.index(".fair_keys AS fq"))
    end = claim.index("WHEN NOT EXISTS", start)
    text = claim[:start] + claim[end:]
    if ".fair_keys" in text:
        raise SystemExit("claim_jobs changed shape: update bench/fairness.py")
    return text


def _statement_cost(dsn: str, claims: int) -> tuple[float, float]:
    with fresh_schema(dsn, "fair_sql") as client, connect(dsn) as conn:
        insert_rows(conn, client.schema, PENDING_ROWS, 2 * (claims + 50) * 10 + 1000)
        vacuum_analyze(conn, client.schema)
        conn.execute("SET plan_cache_mode = force_generic_plan; SET jit = off")
        texts = {"now": client.queries["claim_jobs"]}
        texts["before"] = _without_fair_check(texts["now"])
        params = {"queue": "default", "owner": "bench", "lease_seconds": 60.0, "limit": 10}
        took: dict[str, list[float]] = {name: [] for name in texts}
        for i in range(claims + 50):
            for name in sorted(texts, reverse=bool(i % 2)):
                started = time.perf_counter()
                got = conn.execute(texts[name], params, prepare=True).fetchall()
                if i >= 50:
                    took[name].append(time.perf_counter() - started)
                if len(got) != 10:
                    raise SystemExit("ran out of pending jobs")
    return statistics.median(took["now"]), statistics.median(took["before"])


def _trigger_cost(dsn: str, claims: int) -> tuple[float, float]:
    """The bare claim_jobs of a queue without keys with the jobs_fair_ready trigger (its WHEN
    clause, evaluated for every claimed row) and with it disabled: blocks of 50 claims
    alternating between the two (a trigger is switched by DDL, so not claim by claim), the
    first 10 of each block left out (plans made again after the switch). Medians, seconds."""
    blocks = max(2, claims // 50)
    with fresh_schema(dsn, "fair_trigger") as client, connect(dsn) as conn:
        insert_rows(conn, client.schema, PENDING_ROWS, blocks * 60 * 10 + 1000)
        vacuum_analyze(conn, client.schema)
        conn.autocommit = True
        conn.execute("SET plan_cache_mode = force_generic_plan; SET jit = off")
        table = sql.SQL("{}.jobs").format(sql.Identifier(client.schema))
        params = {"queue": "default", "owner": "bench", "lease_seconds": 60.0, "limit": 10}
        took: dict[bool, list[float]] = {True: [], False: []}
        for b in range(blocks):
            on = b % 2 == 0
            switch = "ENABLE" if on else "DISABLE"
            conn.execute(
                sql.SQL(f"ALTER TABLE {{}} {switch} TRIGGER jobs_fair_ready").format(table)
            )
            for i in range(60):
                started = time.perf_counter()
                got = conn.execute(client.queries["claim_jobs"], params, prepare=True).fetchall()
                if i >= 10:
                    took[on].append(time.perf_counter() - started)
                if len(got) != 10:
                    raise SystemExit("ran out of pending jobs")
    return statistics.median(took[True]), statistics.median(took[False])


def _per_claim(conn: Any, text: str, params: dict[str, Any], claims: int) -> tuple[float, float]:
    """Buffers (hit + read) and WAL bytes per claim statement, from pg_stat_database and the
    WAL position around each claim (the server must have nothing else running)."""

    def snap() -> tuple[int, Any]:
        conn.execute("SELECT pg_stat_force_next_flush()")
        conn.execute("SELECT 1")  # the flush happens at this statement's end
        row = conn.execute(
            "SELECT blks_hit + blks_read, pg_current_wal_lsn() FROM pg_stat_database "
            "WHERE datname = current_database()"
        ).fetchone()
        return int(row[0]), row[1]

    noise = []
    for _ in range(20):
        h0, _l = snap()
        h1, _l = snap()
        noise.append(h1 - h0)
    base = statistics.median(noise)
    hits, wal = [], []
    for _ in range(claims):
        h0, l0 = snap()
        if len(conn.execute(text, params, prepare=True).fetchall()) != params["limit"]:
            raise SystemExit("ran out of pending jobs")
        h1, l1 = snap()
        hits.append(h1 - h0 - base)
        wal.append(int(conn.execute("SELECT %s::pg_lsn - %s::pg_lsn", (l1, l0)).fetchone()[0]))
    return statistics.mean(hits), statistics.mean(wal)


def _claim_counts(dsn: str, keys: int, claims: int) -> dict[str, tuple[float, float]]:
    """The fair claim on ``keys`` keys of 5 jobs each and the plain claim on as many keyless
    jobs: buffers and WAL bytes per claim of 10 (counts, not times: they hold on a busy
    machine, unlike the drain's)."""
    params = {"queue": "default", "owner": "bench", "lease_seconds": 60.0, "limit": 10}
    found: dict[str, tuple[float, float]] = {}
    for mode in ("fair", "plain"):
        with fresh_schema(dsn, f"fair_count_{mode}") as client, connect(dsn) as conn:
            if mode == "fair":
                _fill(dsn, client, 5 * keys, keys)
            else:
                _fill(dsn, client, 5 * keys, 0)
            conn.autocommit = True
            conn.execute("SET plan_cache_mode = force_generic_plan; SET jit = off")
            statement = "claim_fair_jobs" if mode == "fair" else "claim_jobs"
            found[mode] = _per_claim(conn, client.queries[statement], params, claims)
    return found


def _worker_rounds(dsn: str, jobs: int, keys: int, repeat: int, concurrency: int) -> None:
    rates: dict[str, list[float]] = {"plain": [], "fair": []}
    for r in range(repeat):
        order = ["plain", "fair"] if r % 2 == 0 else ["fair", "plain"]
        for mode in order:
            with fresh_schema(dsn, f"fair_worker_{mode}") as client:
                _fill(dsn, client, jobs, keys if mode == "fair" else 0)
                rates[mode].append(_worker_drain(dsn, client.schema, jobs, concurrency))
        print(
            f"worker round {r + 1}: " + ", ".join(f"{m} {rates[m][-1]:,.0f} jobs/s" for m in order)
        )
    ratios = [f / p for f, p in zip(rates["fair"], rates["plain"], strict=True)]
    med = {m: statistics.median(v) for m, v in rates.items()}
    print(
        f"worker at concurrency {concurrency}, {jobs:,} jobs, {keys:,} keys: plain "
        f"{med['plain']:,.0f} jobs/s, fair {med['fair']:,.0f} jobs/s, fair / plain per round "
        f"median {statistics.median(ratios):.3f} (min {min(ratios):.3f}, max {max(ratios):.3f})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--dsn", default=None, help="default: env LEASEQ_DSN, else embedded")
    parser.add_argument("--jobs", type=int, default=40_000)
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--claims", type=int, default=2000)
    parser.add_argument(
        "--worker",
        type=int,
        default=0,
        metavar="C",
        help="also drain with a real worker process at concurrency C (0: not)",
    )
    args = parser.parse_args()
    dsn = resolve_bench_dsn(args.dsn)
    if args.worker:
        _worker_rounds(dsn, args.jobs, args.keys, args.repeat, args.worker)
    rates: dict[str, list[float]] = {"plain": [], "fair": []}
    for r in range(args.repeat):
        order = ["plain", "fair"] if r % 2 == 0 else ["fair", "plain"]
        for mode in order:
            with fresh_schema(dsn, f"fair_{mode}") as client:
                _fill(dsn, client, args.jobs, args.keys if mode == "fair" else 0)
                # Drained as a worker's client claims: prepared statements on their
                # generic plans, no JIT (leaseq.ops.base_async._configure_generic_plans).
                with leaseq.Client(dsn, schema=client.schema, generic_plans=True) as worker:
                    rates[mode].append(_drain(dsn, worker, args.jobs))
        print(f"round {r + 1}: " + ", ".join(f"{m} {rates[m][-1]:,.0f} jobs/s" for m in order))
    med = {m: statistics.median(v) for m, v in rates.items()}
    print(
        f"{args.jobs:,} jobs, {args.keys:,} keys, {args.repeat} round(s): plain "
        f"{med['plain']:,.0f} jobs/s, fair {med['fair']:,.0f} jobs/s, "
        f"fair / plain {med['fair'] / med['plain']:.3f} (target >= 0.85)"
    )
    counts = _claim_counts(dsn, args.keys, 200)
    print(
        "per claim of 10 (buffers, WAL bytes): fair {:.0f}, {:.0f}; plain {:.0f}, {:.0f}".format(
            *counts["fair"], *counts["plain"]
        )
    )
    now, before = _statement_cost(dsn, args.claims)
    with_trigger, without = _trigger_cost(dsn, args.claims)
    print(
        f"claim_jobs of a queue without keys, with the fair-wake trigger: "
        f"{with_trigger * 1000:.3f} ms, without it {without * 1000:.3f} ms: "
        f"{with_trigger / without:.3f}"
    )
    print(
        f"claim_jobs of a queue without keys: {now * 1000:.3f} ms, without the fair check "
        f"{before * 1000:.3f} ms: {now / before:.3f} (target <= 1.03)"
    )


if __name__ == "__main__":
    main()
