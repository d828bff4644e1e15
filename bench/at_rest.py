"""Data at rest in one run: what encryption and payload offload cost a drain.

    .venv/bin/python -m bench.at_rest [--dsn DSN] [--jobs 20000] [--big-jobs 2000]
                                      [--big-bytes 1000000] [--repeat 3] [--only 1k|1m]

Interleaved rounds, each on fresh schemas, each drain a real ``leaseq worker --burst`` (one
process, concurrency 200, batch 100) timed on two clocks (start-up excluded: the database's,
first claim to last completion; process wall), with the worker's CPU time per job (user and
system, start-up included: on a loaded machine the steadier figure of what a job costs):

- ``plain-1k`` / ``sealed-1k``: ``--jobs`` jobs with 1 KB payloads, plain and encrypted
  (AES-256-GCM, leaseq[crypto]); the ratio is issue 34's target (encryption costs at most
  15% of the plain drain);
- ``inline-1m`` / ``offloaded-1m``: ``--big-jobs`` jobs with ``--big-bytes`` payloads, kept
  in the jobs row or offloaded to the payloads table; with the jobs table's heap size after
  the enqueue (issue 34: 1 MB payloads drain at 500 jobs/s or more with the payload store,
  and the hot table stays small).

The enqueues are untimed (COPY in chunks). Prints each sample, the medians and the ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import secrets
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable

from psycopg import sql

import leaseq
from bench.db import connect, drain_clock, drop_schema, new_schema_name, vacuum_analyze
from bench.harness import REPO_ROOT, WORKER_LINE, resolve_bench_dsn, worker_env
from leaseq.codec import generate_key
from leaseq.rows import configure_json

CHUNK = 500
RAW_PART = 4  # payloads per statement of the raw read: ~4 MB, the worker's part


def _fill(client: leaseq.Client, jobs: int, payload: Callable[[int], object]) -> None:
    for start in range(0, jobs, CHUNK):
        count = min(CHUNK, jobs - start)
        client.enqueue_many(
            {"task": "noop", "payload": payload(n)} for n in range(start, start + count)
        )


def _heap(dsn: str, schema: str) -> int:
    with connect(dsn) as conn:
        row = conn.execute(
            "SELECT pg_total_relation_size(%s::regclass)", (f'"{schema}".jobs',)
        ).fetchone()
    return int(row[0]) if row else 0


def _raw_read(dsn: str, schema: str, offloaded: bool) -> float:
    """Jobs/s of reading and decoding every payload with nothing else (no claim, no
    handler, no completion): statements of RAW_PART payloads on two connections at once,
    each result decoded as it arrives, as the worker reads offloaded payloads. The
    machine's ceiling for a drain of them."""
    table, column, key = ("payloads", "data", "job_id") if offloaded else ("jobs", "payload", "id")
    name = sql.Identifier(schema, table)
    with connect(dsn) as conn:
        ids = [
            r[0]
            for r in conn.execute(sql.SQL("SELECT {} FROM {}").format(sql.Identifier(key), name))
        ]
    parts = [ids[i : i + RAW_PART] for i in range(0, len(ids), RAW_PART)]
    query = sql.SQL("SELECT {} FROM {} WHERE {} = ANY(%s)").format(
        sql.Identifier(column), name, sql.Identifier(key)
    )
    lock = threading.Lock()

    def read() -> None:
        with connect(dsn) as conn:
            configure_json(conn)  # jsonb as the worker decodes it
            while True:
                with lock:
                    if not parts:
                        return
                    part = parts.pop()
                for (value,) in conn.execute(query, (part,)).fetchall():
                    if offloaded:
                        json.loads(value)

    readers = [threading.Thread(target=read) for _ in range(2)]
    started = time.perf_counter()
    for t in readers:
        t.start()
    for t in readers:
        t.join()
    return len(ids) / (time.perf_counter() - started)


def _drain(
    dsn: str,
    app: str,
    jobs: int,
    payload: Callable[[int], object],
    raw_ceiling: bool = False,
    **options: object,
) -> dict[str, float]:
    schema = new_schema_name("at-rest")
    client = leaseq.Client(dsn, schema=schema, **options)  # type: ignore[arg-type]
    try:
        client.migrate()
        _fill(client, jobs, payload)
        with connect(dsn) as conn:
            vacuum_analyze(conn, schema)
        heap = _heap(dsn, schema)
        raw = _raw_read(dsn, schema, app == "offloaded") if raw_ceiling else 0.0
        env = worker_env(dsn, schema)
        command = [
            sys.executable,
            "-P",
            "-m",
            "leaseq",
            "worker",
            f"bench.apps_at_rest:{app}",
            "--burst",
            "--concurrency",
            "200",
            "--batch-size",
            "100",
        ]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        done = subprocess.run(
            command, env=env, cwd=REPO_ROOT, capture_output=True, text=True, check=False
        )
        wall = time.perf_counter() - started
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
        if done.returncode != 0 or not WORKER_LINE.search(done.stdout):
            raise SystemExit(f"bench.at_rest: the {app} worker failed: {done.stderr[-2000:]}")
        line = WORKER_LINE.search(done.stdout)
        assert line is not None
        if int(line["succeeded"]) != jobs:
            raise SystemExit(f"bench.at_rest: {app} drained {line['succeeded']} of {jobs}")
        db = drain_clock(dsn, schema)
        return {
            "db": jobs / db,
            "wall": jobs / wall,
            "heap_mb": heap / 1e6,
            "cpu_us": cpu / jobs * 1e6,
            "raw": raw,
        }
    finally:
        client.close()
        drop_schema(dsn, schema)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.at_rest")
    p.add_argument("--dsn", default=None)
    p.add_argument("--jobs", type=int, default=20000)
    p.add_argument("--big-jobs", type=int, default=2000)
    p.add_argument("--big-bytes", type=int, default=1_000_000)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument(
        "--only",
        choices=("1k", "1m"),
        default=None,
        help="only the 1 KB pair (encryption) or only the 1 MB pair (offload)",
    )
    args = p.parse_args(argv)
    dsn = resolve_bench_dsn(args.dsn)
    key = os.environ.setdefault("LEASEQ_ENCRYPTION_KEYS", generate_key())
    # Random text, as real documents and prompts compress far less than repeated letters
    # (TOAST would shrink "yyyy..." to nothing and hide the cost of carrying the payload).
    small = {"data": secrets.token_urlsafe(750)[:1000]}
    big = {"data": secrets.token_urlsafe(args.big_bytes)[: args.big_bytes]}
    sealing = leaseq.Encryption([key.split(",")[0]])
    variants: dict[str, Callable[[], dict[str, float]]] = {
        "plain-1k": lambda: _drain(dsn, "plain", args.jobs, lambda n: small),
        "sealed-1k": lambda: _drain(dsn, "sealed", args.jobs, lambda n: small, encryption=sealing),
        "inline-1m": lambda: _drain(dsn, "plain", args.big_jobs, lambda n: big, True),
        "offloaded-1m": lambda: _drain(
            dsn, "offloaded", args.big_jobs, lambda n: big, True, offload_above=64 * 1024
        ),
    }
    if args.only is not None:
        variants = {k: v for k, v in variants.items() if k.endswith(f"-{args.only}")}
    found: dict[str, list[dict[str, float]]] = {name: [] for name in variants}
    for r in range(args.repeat):
        for name, run in variants.items():
            sample = run()
            found[name].append(sample)
            print(
                f"round {r + 1} {name:13} start-up excluded {sample['db']:9.0f} jobs/s  "
                f"wall {sample['wall']:9.0f} jobs/s  jobs table {sample['heap_mb']:8.1f} MB  "
                f"worker CPU {sample['cpu_us']:7.1f} us/job"
                + (f"  raw read {sample['raw']:6.0f} jobs/s" if sample["raw"] else ""),
                file=sys.stderr,
                flush=True,
            )

    def med(name: str, clock: str) -> float:
        return statistics.median(s[clock] for s in found[name])

    def ratio(a: str, b: str, clock: str) -> str:
        per_round = [x[clock] / y[clock] for x, y in zip(found[a], found[b], strict=True)]
        return f"{statistics.median(per_round):.2f} ({min(per_round):.2f}-{max(per_round):.2f})"

    print(
        "| variant | jobs/s, start-up excluded | jobs/s, process wall | jobs table after enqueue "
        "| worker CPU per job (start-up included) |"
    )
    print("|---|---|---|---|---|")
    for name in variants:
        print(
            f"| {name} | {med(name, 'db'):,.0f} | {med(name, 'wall'):,.0f} | "
            f"{statistics.median(s['heap_mb'] for s in found[name]):,.1f} MB | "
            f"{med(name, 'cpu_us'):,.1f} µs |"
        )
    for clock, label in (("db", "start-up excluded"), ("wall", "process wall"), ("cpu_us", "")):
        if clock == "cpu_us":
            if "sealed-1k" in found:
                cpu = ratio("sealed-1k", "plain-1k", clock)
                print(f"worker CPU per job, sealed / plain, 1 KB: {cpu}")
            continue
        if "sealed-1k" in found:
            print(
                f"sealed / plain, 1 KB, {label}: {ratio('sealed-1k', 'plain-1k', clock)}"
                " (target >= 0.85)"
            )
        if "offloaded-1m" in found:
            print(f"offloaded / inline, 1 MB, {label}: {ratio('offloaded-1m', 'inline-1m', clock)}")
    if "offloaded-1m" in found:
        print(
            f"offloaded 1 MB drain, start-up excluded: {med('offloaded-1m', 'db'):,.0f} jobs/s"
            " (target >= 500)"
        )
        for name in ("offloaded-1m", "inline-1m"):
            per_round = [s["db"] / s["raw"] for s in found[name]]
            print(
                f"{name}: raw read of its payloads (two connections, decode only) "
                f"{med(name, 'raw'):,.0f} jobs/s; the drain reaches "
                f"{statistics.median(per_round):.2f} of it"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
