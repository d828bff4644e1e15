"""``python -m bench.cost``: where the SQL cost of a job goes (issue 35), for the seed's
minimal queue (bench/minimal.py) and for leaseq's own claim and completion statements on
leaseq's table, side by side on one server. Nothing here is timed against the other side
except the claim's EXPLAIN, so the figures hold on a busy machine too.

For each system N no-op jobs are loaded, then claimed in batches of B (every claim first),
then completed in batches of B, on one connection. Per transition and per job it reports:
- WAL records, bytes and full-page images (``pg_stat_wal``, ``pg_current_wal_lsn``: the
  server must have nothing else writing; the embedded server of a checkout has not);
- heap updates and how many were HOT (``pg_stat_user_tables``);
- index entries written, per index: a non-HOT update adds an entry to every index whose
  predicate the new row version satisfies, so each index's share is its predicate
  evaluated on the rows after the transition (an index the transition does not need is a
  cost the figure names);
- the claim's EXPLAIN (ANALYZE, BUFFERS) on a fresh backlog of N, 5 runs rolled back, the
  median: planning and execution time and the time of each InitPlan and SubPlan (leaseq's
  pause, limit and slot checks). Only this figure is a time, and it is one process's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from collections.abc import Sequence
from typing import Any

import psycopg

import leaseq
from bench import minimal
from bench.db import claim_params, connect, drop_schema, fill_queue, new_schema_name
from bench.harness import resolve_bench_dsn
from leaseq.params import text_array
from leaseq.sql import Queries

Conn = psycopg.Connection[Any]


def _wal(conn: Conn) -> tuple[int, int, int]:
    """(LSN in bytes, WAL records, full-page images), after a stats flush of this backend."""
    conn.execute("SELECT pg_stat_force_next_flush()")
    conn.execute("SELECT pg_stat_clear_snapshot()")
    row = conn.execute(
        "SELECT pg_current_wal_lsn() - '0/0'::pg_lsn, wal_records, wal_fpi FROM pg_stat_wal"
    ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1]), int(row[2])


def _updates(conn: Conn, schema: str) -> tuple[int, int]:
    conn.execute("SELECT pg_stat_clear_snapshot()")
    row = conn.execute(
        "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables "
        "WHERE schemaname = %s AND relname = 'jobs'",
        (schema,),
    ).fetchone()
    return (int(row[0]), int(row[1])) if row else (0, 0)


def _index_shares(conn: Conn, schema: str) -> dict[str, float]:
    """Per index of the jobs table: the share of rows its predicate admits right now."""
    rows = conn.execute(
        "SELECT c.relname, pg_get_expr(i.indpred, i.indrelid) FROM pg_index i "
        "JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_class t ON t.oid = i.indrelid "
        "JOIN pg_namespace n ON n.oid = t.relnamespace "
        "WHERE n.nspname = %s AND t.relname = 'jobs' ORDER BY c.relname",
        (schema,),
    ).fetchall()
    table = f'"{schema}".jobs'
    total = conn.execute(f"SELECT count(*) FROM {table}").fetchone()
    n = int(total[0]) if total else 0
    shares: dict[str, float] = {}
    for name, pred in rows:
        if pred is None:
            shares[str(name)] = 1.0
            continue
        hit = conn.execute(f"SELECT count(*) FROM {table} WHERE {pred}").fetchone()
        shares[str(name)] = (int(hit[0]) if hit else 0) / n if n else 0.0
    return shares


def _measure(conn: Conn, schema: str, jobs: int, run: Any) -> dict[str, Any]:
    lsn0, rec0, fpi0 = _wal(conn)
    upd0, hot0 = _updates(conn, schema)
    run()
    lsn1, rec1, fpi1 = _wal(conn)
    upd1, hot1 = _updates(conn, schema)
    updates, hot = upd1 - upd0, hot1 - hot0
    non_hot_share = (updates - hot) / jobs
    entries = {k: round(v * non_hot_share, 3) for k, v in _index_shares(conn, schema).items()}
    return {
        "wal_bytes_per_job": round((lsn1 - lsn0) / jobs, 1),
        "wal_records_per_job": round((rec1 - rec0) / jobs, 2),
        "full_page_images_per_job": round((fpi1 - fpi0) / jobs, 3),
        "updates_per_job": round(updates / jobs, 2),
        "hot_share": round(hot / updates, 3) if updates else 0.0,
        "index_entries_per_job": entries,
        "index_entries_per_job_total": round(sum(entries.values()), 3),
    }


EXPLAINS = 5  # the claim's EXPLAIN ANALYZE runs, rolled back; the medians are reported


def _explain(conn: Conn, text: str, params: dict[str, Any]) -> dict[str, Any]:
    runs = [_explain_once(conn, text, params) for _ in range(EXPLAINS)]
    mid = sorted(runs, key=lambda r: float(r["execution_ms"]))[EXPLAINS // 2]
    mid["planning_ms"] = statistics.median(float(r["planning_ms"]) for r in runs)
    return mid


def _explain_once(conn: Conn, text: str, params: dict[str, Any]) -> dict[str, Any]:
    conn.execute("BEGIN")
    try:
        row = conn.execute(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {text}", params).fetchone()
    finally:
        conn.execute("ROLLBACK")
    assert row is not None
    plan = row[0][0]
    subplans: dict[str, float] = {}

    def walk(node: dict[str, Any]) -> None:
        name = node.get("Subplan Name")
        if name:
            subplans[name] = round(node["Actual Total Time"] * node.get("Actual Loops", 1), 3)
        for child in node.get("Plans", ()):
            walk(child)

    walk(plan["Plan"])
    return {
        "planning_ms": round(plan["Planning Time"], 3),
        "execution_ms": round(plan["Execution Time"], 3),
        "subplans_ms": subplans,
    }


def _minimal(dsn: str, jobs: int, batch: int) -> dict[str, Any]:
    schema = new_schema_name("cost-minimal")
    claim, complete = minimal._text(minimal.CLAIM, schema), minimal._text(minimal.COMPLETE, schema)
    params: dict[str, Any] = {"queue": minimal.QUEUE, "owner": "cost", "limit": batch}
    try:
        with connect(dsn) as conn:
            conn.execute(f'CREATE SCHEMA "{schema}"')
            minimal.create(conn, schema)
            minimal.load(conn, schema, jobs)
            explain = _explain(conn, claim, params)
            conn.execute("SET jit = off")
            claimed: list[tuple[int, int]] = []

            def claim_all() -> None:
                while rows := conn.execute(claim, params).fetchall():
                    claimed.extend((int(r[0]), int(r[1])) for r in rows)

            def complete_all() -> None:
                for i in range(0, len(claimed), batch):
                    part = claimed[i : i + batch]
                    conn.execute(
                        complete,
                        {
                            "ids": [p[0] for p in part],
                            "tokens": [p[1] for p in part],
                            "owner": "cost",
                        },
                    )

            out = {"claim": _measure(conn, schema, jobs, claim_all)}
            out["complete"] = _measure(conn, schema, jobs, complete_all)
            out["claim_explain"] = explain
            return out
    finally:
        drop_schema(dsn, schema)


def _leaseq(dsn: str, jobs: int, batch: int) -> dict[str, Any]:
    schema = new_schema_name("cost-leaseq")
    queries = Queries(schema)
    claim, complete = queries["claim_jobs"], queries["complete_jobs"]
    params = claim_params("cost", batch)
    client = leaseq.Client(dsn, schema=schema)
    try:
        client.migrate()
        fill_queue(dsn, client, jobs)
        with connect(dsn) as conn:
            explain = _explain(conn, claim, params)
            conn.execute("SET jit = off")
            claimed: list[tuple[int, int, str]] = []

            def claim_all() -> None:
                while rows := conn.execute(claim, params).fetchall():
                    claimed.extend((int(r[0]), int(r[1]), str(r[2])) for r in rows)

            def complete_all() -> None:
                claimed.sort()
                for i in range(0, len(claimed), batch):
                    part = claimed[i : i + batch]
                    conn.execute(
                        complete,
                        {
                            "ids": "{" + ",".join(str(p[0]) for p in part) + "}",
                            "tokens": "{" + ",".join(str(p[1]) for p in part) + "}",
                            "owners": text_array(p[2] for p in part),
                        },
                    )

            out = {"claim": _measure(conn, schema, jobs, claim_all)}
            out["complete"] = _measure(conn, schema, jobs, complete_all)
            out["claim_explain"] = explain
            return out
    finally:
        client.close()
        drop_schema(dsn, schema)


def measure(dsn: str, jobs: int, batch: int) -> dict[str, Any]:
    return {"minimal": _minimal(dsn, jobs, batch), "leaseq": _leaseq(dsn, jobs, batch)}


def render(result: dict[str, Any]) -> str:
    lines = []
    for system, phases in result.items():
        for phase in ("claim", "complete"):
            m = phases[phase]
            lines.append(
                f"{system:8} {phase:9} WAL {m['wal_bytes_per_job']:7.1f} B/job "
                f"{m['wal_records_per_job']:5.2f} rec/job "
                f"{m['full_page_images_per_job']:5.3f} FPI/job  "
                f"updates {m['updates_per_job']:.2f}/job HOT {m['hot_share']:.0%}  "
                f"index entries {m['index_entries_per_job_total']:.2f}/job"
            )
            for index, n in m["index_entries_per_job"].items():
                lines.append(f"{'':19}{index}: {n:.2f}/job")
        e = phases["claim_explain"]
        subs = ", ".join(f"{k} {v} ms" for k, v in e["subplans_ms"].items()) or "none"
        lines.append(
            f"{system:8} claim of one batch: planning {e['planning_ms']} ms, "
            f"execution {e['execution_ms']} ms; sub-plans: {subs}"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.cost", description=__doc__.split("\n")[0])
    p.add_argument("--dsn", default=os.environ.get("LEASEQ_DSN", ""))
    p.add_argument("--jobs", type=int, default=10_000)
    p.add_argument("--batch", type=int, default=100)
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = p.parse_args(argv)
    dsn = resolve_bench_dsn(args.dsn)
    result = measure(dsn, args.jobs, args.batch)
    print(json.dumps(result, indent=2) if args.json else render(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
