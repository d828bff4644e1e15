"""Concurrency limits against none, in one run: the drain through the client.

    .venv/bin/python -m bench.limits [--dsn DSN] [--jobs 20000] [--batch 100] [--repeat 3]

Three schemas with the same N pending no-op jobs, each drained by claims of ``--batch``
jobs (a 100-slot worker's round), each batch completed with one fenced statement, until a
claim returns nothing:

- ``none``: no limit anywhere (the claim's plain path);
- ``generous``: ``queue:default`` with a concurrency far above what ever runs (every claim
  takes a slot per job, every completion gives them back; the limit is never reached);
- ``limit50``: ``queue:default`` at 50 on the 100-job rounds, so each claim is cut to the
  free slots;
- ``cost3``: the ``generous`` limit with every job of cost 3 (issue 32): the limit's slots
  move to slot rows at the first claim, three rows per job (``admit()``'s path).

The modes take turns within each repeat (none, generous, limit50, none, ...). Each drain runs
on a client of one pooled connection, so besides the wall clock it reports CPU per job: this
process's, and, when the server runs on this machine and its /proc is readable, that
connection's server backend's. On a shared, loaded machine the CPU figures are the steadier
measure of what a limit costs; the wall clock is what a drain takes.

Prints per-sample figures, their medians and the costs against ``none`` (issue 16's target:
a limit that is never reached costs at most 10% of the drain).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from dataclasses import dataclass

import leaseq
from bench.db import connect, drop_schema, new_schema_name, vacuum_analyze
from bench.harness import resolve_bench_dsn

#: Each mode's queue limit (None: none) and its jobs' cost.
MODES: dict[str, tuple[int | None, int]] = {
    "none": (None, 1),
    "generous": (100_000, 1),
    "limit50": (50, 1),
    "cost3": (100_000, 3),
}
APP_NAME = "leaseq-bench-limits"


@dataclass(frozen=True)
class Sample:
    jobs_per_second: float
    #: Microseconds of CPU per job: this process, and its server backend (None: unreadable).
    client_us: float
    server_us: float | None


def _fill(client: leaseq.Client, jobs: int, cost: int) -> None:
    chunk = 1000
    job = {"task": "t"} if cost == 1 else {"task": "t", "cost": cost}
    for start in range(0, jobs, chunk):
        client.enqueue_many([job for _ in range(start, min(start + chunk, jobs))])


def _backend_cpu(pid: int | None) -> float | None:
    """CPU seconds (user + system) of a server process on this machine, else None."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _backend_pid(dsn: str) -> int | None:
    with connect(dsn) as conn:
        row = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = %s", (APP_NAME,)
        ).fetchall()
    return int(row[0][0]) if len(row) == 1 else None


def _drain(client: leaseq.Client, batch: int) -> int:
    done = 0
    while leases := client.claim(worker="bench", limit=batch):
        done += len(client.complete_many(leases))
    return done


def _sample(dsn: str, jobs: int, batch: int, concurrency: int | None, cost: int) -> Sample:
    schema = new_schema_name("limits")
    client = leaseq.Client(dsn, schema=schema, pool_size=1, application_name=APP_NAME)
    try:
        client.migrate()  # also opens the pool's one connection
        _fill(client, jobs, cost)
        if concurrency is not None:
            client.set_limit("queue:default", concurrency=concurrency)
        with connect(dsn) as conn:
            vacuum_analyze(conn, schema)
        pid = _backend_pid(dsn)
        server0, client0 = _backend_cpu(pid), time.process_time()
        started = time.perf_counter()
        done = _drain(client, batch)
        took = time.perf_counter() - started
        server1, client1 = _backend_cpu(pid), time.process_time()
        assert done == jobs, f"drained {done} of {jobs}"
        server_us = None
        if server0 is not None and server1 is not None:
            server_us = (server1 - server0) * 1e6 / jobs
        return Sample(jobs / took, (client1 - client0) * 1e6 / jobs, server_us)
    finally:
        client.close()
        drop_schema(dsn, schema)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", default=None, help="default: env LEASEQ_DSN, else embedded")
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    dsn = resolve_bench_dsn(args.dsn)
    drain: dict[str, list[Sample]] = {mode: [] for mode in MODES}
    for _ in range(args.repeat):
        for mode, (concurrency, cost) in MODES.items():
            drain[mode].append(_sample(dsn, args.jobs, args.batch, concurrency, cost))
    print(
        f"{args.jobs:,} jobs drained by claims of {args.batch} + one fenced completion per "
        f"batch; {args.repeat} samples each"
    )
    med = {mode: statistics.median(s.jobs_per_second for s in v) for mode, v in drain.items()}
    cpu: dict[str, float | None] = {}
    for mode, values in drain.items():
        shown = ", ".join(f"{s.jobs_per_second:,.0f}" for s in values)
        print(f"drain {mode:9} {med[mode]:9,.0f} jobs/s (samples: {shown})")
        client_us = statistics.median(s.client_us for s in values)
        servers = [s.server_us for s in values if s.server_us is not None]
        server_us = statistics.median(servers) if len(servers) == len(values) else None
        cpu[mode] = None if server_us is None else client_us + server_us
        server = "server unreadable" if server_us is None else f"server {server_us:.1f}"
        print(f"  cpu us/job: client {client_us:.1f}, {server}")
    for mode in ("generous", "limit50", "cost3"):
        line = f"drain cost {mode} / none: {med['none'] / med[mode]:.2f}x"
        base, this = cpu["none"], cpu[mode]
        if base is not None and this is not None:
            line += f" (cpu per job, client + server: {this / base:.2f}x)"
        print(line)


if __name__ == "__main__":
    main()
