"""Retention under a hot table: a prune statement reads about the rows it deletes, never
the retention window or the backlog, so that each one is short (a long statement holds
back the xmin horizon that claims' index scans and autovacuum need)."""

from __future__ import annotations

from typing import Any

import psycopg

import leaseq
from tests.support.helpers import run_sql


def plan_nodes(node: dict[str, Any]) -> list[dict[str, Any]]:
    """A JSON plan node and every node under it."""
    found = [node]
    for child in node.get("Plans", []):
        found += plan_nodes(child)
    return found


def test_a_rounds_last_prune_batch_reads_only_what_it_deletes(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    """The boundary: the last batch of a prune round, which finds fewer rows than its limit.
    Walking the primary key from the oldest id, it read every row of the table to learn
    that there was nothing more: here a backlog of 5,000 pending jobs (the lowest ids) and
    20,000 jobs finished inside the retention window. At the drain limit that was 0.2-1.5 s
    per statement (python -m bench.sustained). It must now delete the 50 expired jobs
    (the highest ids) and pass over next to nothing else."""
    run_sql(
        dsn,
        "INSERT INTO {s}.jobs (queue_name, task, payload) "
        "SELECT 'default', 'noop', '{{}}' FROM generate_series(1, 5000)",
        schema,
    )
    run_sql(
        dsn,
        "INSERT INTO {s}.jobs (queue_name, task, payload, status, attempt_count, lease_token, "
        "started_at, finished_at) SELECT 'default', 'noop', '{{}}', 'succeeded', 1, 1, "
        "now() - interval '61 seconds', now() - interval '1 minute' "
        "FROM generate_series(1, 20000)",
        schema,
    )
    run_sql(
        dsn,
        "INSERT INTO {s}.jobs (queue_name, task, payload, status, attempt_count, lease_token, "
        "started_at, finished_at) SELECT 'default', 'noop', '{{}}', 'succeeded', 1, 1, "
        "now() - interval '2 days', now() - interval '2 days' FROM generate_series(1, 50)",
        schema,
    )
    run_sql(dsn, "ANALYZE {s}.jobs", schema)
    with psycopg.connect(dsn) as conn:
        ((plan,),) = conn.execute(
            "EXPLAIN (ANALYZE, FORMAT JSON) " + client.queries["prune_finished"],
            {"older_than": 86400, "limit": 1000},
        ).fetchall()
        conn.rollback()
    nodes = plan_nodes(plan[0]["Plan"])
    assert plan[0]["Plan"]["Actual Rows"] == 50, "every expired job is deleted"
    scans = [n for n in nodes if n.get("Relation Name") == "jobs" and "Scan" in n["Node Type"]]
    read = sum(n["Actual Rows"] + n.get("Rows Removed by Filter", 0) for n in scans)
    assert read <= 2 * 50 + 10, f"the prune read {read} job rows to delete 50: {scans}"
    assert client.prune(older_than=86400) == 50
    assert client.prune(older_than=86400) == 0
