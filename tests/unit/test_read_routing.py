"""Which client methods may read on the replica (``read_dsn``): a fixed list of inspection
reads. A new method that sends ``_read`` must be added here on purpose; a write method, or
a read the worker and result waits rely on, must never appear (it would reach a standby,
which refuses writes and lags behind)."""

from __future__ import annotations

import ast
import pathlib
import re

from leaseq.sql import Queries

OPS = pathlib.Path(__file__).resolve().parents[2] / "leaseq" / "ops"

#: The plumbing: the read pool's construction, its DSN, closing it, its lag.
PLUMBING = {"__init__", "close", "read_dsn", "read_replica_lag"}

#: Every method allowed to run statements on the read replica.
REPLICA_READS = {
    "_read",
    "_read_together",
    "_web_rows",
    "web_overview",
    "web_throughput",
    "web_jobs",
    "web_dead",
    "web_job",
    "web_job_durable",
    "web_suspended",
    "web_blocked_keys",
    "web_pauses",
    "web_limits",
    "web_fair_keys",
    "web_autoscaling",
    "web_waiting",
    "web_job_links",
    "web_workers",
    "web_tasks",
    "web_dead_groups",
    "web_state_estimates",
    "web_suggestions",
    "get_job",
    "job_events",
    "unique_key_holder",
    "list_jobs",
    "count_jobs",
    "job_effects",
    "job_steps",
    "job_signals",
    "suspended_stats",
    "queue_stats",
    "database_health",
    "blocked_keys",
    "dependencies",
    "dependents",
    "waiting_jobs",
    "job_batch",
    "waiting_stats",
    "get_batch",
    "pauses",
    "admin_events",
    "limits",
    "autoscaling",
    "schedules",
    "schedule_ticks",
}

#: Reads that must see the primary's own, latest state: never on the replica.
PRIMARY_ONLY = {
    "result",
    "job_result",
    "dependency_results",
    "attempts_ended",
    "queues_have_work",
    "effect_get",
    "step_records",
    "claim_wait",
    "migrate",
    "schema_version",
    "check_schema",
}


def _methods_reading_the_replica() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for source in sorted(OPS.glob("*_async.py")):
        tree = ast.parse(source.read_text("utf-8"))
        for node in ast.walk(tree):
            if not isinstance(node, ast.AsyncFunctionDef | ast.FunctionDef):
                continue
            for call in ast.walk(node):
                if (
                    isinstance(call, ast.Attribute)
                    and isinstance(call.value, ast.Name)
                    and call.value.id == "self"
                    and call.attr in {"_read", "_read_together", "_reads", "_web_rows"}
                ):
                    found.setdefault(node.name, set()).add(source.name)
    return found


def test_only_the_listed_inspection_reads_reach_the_replica() -> None:
    readers = _methods_reading_the_replica()
    unexpected = sorted(set(readers) - REPLICA_READS - PLUMBING)
    assert not unexpected, f"these methods read on the replica without being listed: {unexpected}"
    assert not set(readers) & PRIMARY_ONLY


def test_the_statements_replica_reads_send_are_read_only() -> None:
    """Every named statement a replica read sends only reads: no INSERT, UPDATE, DELETE,
    row lock, advisory lock or NOTIFY (a standby would refuse them; and a read that needs
    them is not an inspection read)."""
    queries = Queries("leaseq")
    known = set(queries.names())
    writes = re.compile(
        r"\b(INSERT|UPDATE|DELETE|FOR (NO KEY )?UPDATE|FOR SHARE|pg_advisory\w*|pg_notify|"
        r"nextval|setval)\b",
        re.IGNORECASE,
    )
    checked = 0
    for source in sorted(OPS.glob("*_async.py")):
        tree = ast.parse(source.read_text("utf-8"))
        for node in ast.walk(tree):
            if not isinstance(node, ast.AsyncFunctionDef) or node.name not in REPLICA_READS:
                continue
            for c in ast.walk(node):
                if isinstance(c, ast.Constant) and c.value in known:
                    checked += 1
                    text = queries[str(c.value)]
                    assert not writes.search(text), (node.name, c.value)
    assert checked >= 20
