"""Retention under a hot table: a prune statement reads about the rows it deletes, never
the retention window or the backlog, so that each one is short (a long statement holds
back the xmin horizon that claims' index scans and autovacuum need)."""

from __future__ import annotations

import re
from typing import Any

import psycopg
import pytest

import leaseq
from tests.support.helpers import run_sql

PARAM = re.compile(r"%\((\w+)\)s")


def plan_nodes(node: dict[str, Any]) -> list[dict[str, Any]]:
    """A JSON plan node and every node under it."""
    found = [node]
    for child in node.get("Plans", []):
        found += plan_nodes(child)
    return found


def explain_prune(conn: psycopg.Connection[Any], query: str, mode: str) -> Any:
    """EXPLAIN ANALYZE of the prune as a prepared statement under ``plan_cache_mode``:
    the worker's pool runs its statements on their generic plan (force_generic_plan)."""
    order: list[str] = []

    def placeholder(m: re.Match[str]) -> str:
        if m.group(1) not in order:
            order.append(m.group(1))
        return f"${order.index(m.group(1)) + 1}"

    text = PARAM.sub(placeholder, query)
    types = {"older_than": "float8", "limit": "int"}
    values = {"older_than": "86400", "limit": "1000"}
    conn.execute(f"PREPARE prune_test({', '.join(types[n] for n in order)}) AS {text}")
    conn.execute(f"SET plan_cache_mode = {mode}")
    args = ", ".join(values[n] for n in order)
    ((plan,),) = conn.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE prune_test({args})")
    return plan


@pytest.mark.parametrize("mode", ["auto", "force_generic_plan"])
def test_a_rounds_last_prune_batch_reads_only_what_it_deletes(
    dsn: str, schema: str, client: leaseq.Client, mode: str
) -> None:
    """The boundary: the last batch of a prune round, which finds fewer rows than its limit.
    Walking the primary key from the oldest id, it read every row of the table to learn
    that there was nothing more: here a backlog of 5,000 pending jobs (the lowest ids) and
    20,000 jobs finished inside the retention window. At the drain limit that was 0.2-1.5 s
    per statement (python -m bench.sustained). It must now delete the 50 expired jobs
    (the highest ids) and pass over next to nothing else, on a custom plan and on the
    generic plan the worker uses (which joined the batch to a seq scan of the table)."""
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
        plan = explain_prune(conn, client.queries["prune_finished"], mode)
        conn.rollback()
    nodes = plan_nodes(plan[0]["Plan"])
    assert plan[0]["Plan"]["Actual Rows"] == 50, "every expired job is deleted"
    scans = [n for n in nodes if n.get("Relation Name") == "jobs" and "Scan" in n["Node Type"]]
    read = sum(n["Actual Rows"] + n.get("Rows Removed by Filter", 0) for n in scans)
    assert read <= 2 * 50 + 10, f"the prune read {read} job rows to delete 50: {scans}"
    assert client.prune(older_than=86400) == 50
    assert client.prune(older_than=86400) == 0
