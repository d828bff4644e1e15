"""Fan-out/fan-in against the same jobs without dependencies, in one run.

    .venv/bin/python -m bench.workflows [--dsn DSN] [--children 10000] [--batch 100] [--repeat 3]

The DAG: one root, ``--children`` children that depend on it (one ``enqueue_many``), and one
fan-in job that depends on every child. The baseline: the same number of independent jobs
(one ``enqueue_many``). Each is drained through the client: claims of ``--batch`` jobs, each
batch completed with one fenced call (``complete_many``), until a claim returns nothing.

Printed per variant: enqueue time, drain rate (jobs/s), and for the DAG:
- the root's completion call, which promotes every child in its transaction;
- the completion call that ends the last child, which promotes the fan-in;
- promotion latency p50/p99 over the samples: the first child's claim (started_at) minus
  the root's end (finished_at), both on the database clock, and the fan-in's start minus
  the end of its last child. In this loop the claim follows the completion at once, so
  these are the time from "dependency ended" to "dependent running" through a real claim
  (the other children then queue behind the first at the drain rate).
Also the plain drain with the same client in a schema where no job has dependencies:
plain completions run the plain statements (the coordinated path is taken only by jobs
that have dependents or a batch), so this is the check that dependencies cost a plain
drain nothing.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import leaseq
from bench.db import connect, fresh_schema, vacuum_analyze
from bench.harness import percentile, resolve_bench_dsn


def _drain(
    client: leaseq.Client, batch: int, watch: set[int]
) -> tuple[int, float, dict[int, float]]:
    """Claims and completions until empty; the completion call of a batch holding a
    watched id is timed."""
    done = 0
    timed: dict[int, float] = {}
    started = time.perf_counter()
    while leases := client.claim(worker="bench", limit=batch):
        t0 = time.perf_counter()
        done += len(client.complete_many(leases))
        for lease in leases:
            if lease.job_id in watch:
                timed[lease.job_id] = time.perf_counter() - t0
    return done, time.perf_counter() - started, timed


def _last_call(dsn: str, schema: str, timed: dict[int, float]) -> float:
    with connect(dsn) as conn:
        row = conn.execute(
            f'''SELECT d.depends_on FROM "{schema}".job_deps AS d
                JOIN "{schema}".jobs AS p ON p.id = d.depends_on
                WHERE d.job_id = (SELECT max(job_id) FROM "{schema}".job_deps)
                ORDER BY p.finished_at DESC, p.id DESC LIMIT 1'''
        ).fetchone()
    assert row is not None
    return timed[int(row[0])]


def _latencies(dsn: str, schema: str) -> tuple[list[float], list[float]]:
    with connect(dsn) as conn:
        rows: list[Any] = conn.execute(
            f'''SELECT d.job_id,
                       extract(epoch FROM j.started_at - max(p.finished_at))::float8,
                       count(*)
                FROM "{schema}".job_deps AS d
                JOIN "{schema}".jobs AS j ON j.id = d.job_id
                JOIN "{schema}".jobs AS p ON p.id = d.depends_on
                GROUP BY d.job_id, j.started_at'''
        ).fetchall()
    children = [r[1] for r in rows if r[2] == 1]
    fan_in = [r[1] for r in rows if r[2] > 1]
    return children, fan_in


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", default=None, help="default: env LEASEQ_DSN, else embedded")
    parser.add_argument("--children", type=int, default=10_000)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    dsn = resolve_bench_dsn(args.dsn)
    n = args.children
    out: dict[str, list[float]] = {
        k: [] for k in ("plain_enqueue", "dag_enqueue", "plain_rate", "dag_rate", "root", "last")
    }
    child_lat: list[float] = []
    fan_lat: list[float] = []
    for _ in range(args.repeat):
        with fresh_schema(dsn, "flows") as client:
            t0 = time.perf_counter()
            client.enqueue_many([{"task": "t"} for _ in range(n + 2)])
            out["plain_enqueue"].append(time.perf_counter() - t0)
            with connect(dsn) as conn:
                vacuum_analyze(conn, client.schema)
            done, took, _ = _drain(client, args.batch, set())
            assert done == n + 2
            out["plain_rate"].append(done / took)
        with fresh_schema(dsn, "flows") as client:
            t0 = time.perf_counter()
            root = client.enqueue("t")
            kids = client.enqueue_many([{"task": "t", "depends_on": [root]} for _ in range(n)])
            fan = client.enqueue("t", depends_on=[int(k) for k in kids])
            out["dag_enqueue"].append(time.perf_counter() - t0)
            with connect(dsn) as conn:
                vacuum_analyze(conn, client.schema)
            done, took, timed = _drain(client, args.batch, {int(root), *map(int, kids)})
            assert done == n + 2, done
            out["dag_rate"].append(done / took)
            out["root"].append(timed[int(root)])
            # The fan-in is promoted by the call that completed the last child to end.
            out["last"].append(_last_call(dsn, client.schema, timed))
            kids_lat, fan_in = _latencies(dsn, client.schema)
            child_lat.append(min(kids_lat))  # the first child: the rest queue behind it
            fan_lat += fan_in
            assert client.get_job(fan).status is leaseq.JobStatus.SUCCEEDED  # type: ignore[union-attr]

    def med(key: str) -> float:
        return statistics.median(out[key])

    print(f"fan-out/fan-in of {n:,} children, claims of {args.batch}, {args.repeat} samples")
    print(f"enqueue  plain {n + 2:,} jobs: {med('plain_enqueue') * 1000:8.1f} ms")
    print(
        f"enqueue  DAG (root + children + fan-in): {med('dag_enqueue') * 1000:8.1f} ms "
        f"({med('dag_enqueue') / med('plain_enqueue'):.2f}x)"
    )
    print(f"drain    plain: {med('plain_rate'):9,.0f} jobs/s")
    print(
        f"drain    DAG:   {med('dag_rate'):9,.0f} jobs/s "
        f"(plain / DAG: {med('plain_rate') / med('dag_rate'):.2f}x)"
    )
    print(f"root's completion call (promotes {n:,}): {med('root') * 1000:.1f} ms")
    print(f"completion of the last children (promotes the fan-in): {med('last') * 1000:.1f} ms")
    print(
        f"promotion latency, 1st child: p50 {percentile(child_lat, 50) * 1000:.1f} ms, "
        f"p99 {percentile(child_lat, 99) * 1000:.1f} ms ({len(child_lat)} samples)"
    )
    print(
        f"promotion latency, fan-in:    p50 {percentile(fan_lat, 50) * 1000:.1f} ms, "
        f"p99 {percentile(fan_lat, 99) * 1000:.1f} ms ({len(fan_lat)} samples)"
    )


if __name__ == "__main__":
    main()
