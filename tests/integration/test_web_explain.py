"""The dashboard's default pages (workers, tasks, dead groups, the dead list's next page,
the job list's state counts and the task and error code suggestions included), and the
queue_stats view behind `leaseq status`, on a 1,000,000-job table: EXPLAIN every read they
send (with the values they bind) and fail on a sequential scan of the jobs table, which on a
big history is what turns a dashboard into a 45-second page (good_job#1366)."""

from __future__ import annotations

import re

import psycopg
import pytest

import leaseq
from bench.web import add_limits, explain, fill_history

pytestmark = pytest.mark.slow

MILLION = 1_000_000


def test_default_pages_never_scan_the_jobs_table(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    fill_history(dsn, schema, MILLION)
    add_limits(client)
    dead = client.list_jobs("dead", limit=1)
    assert dead, "the history has dead jobs"
    plans = explain(dsn, client, dead[0].job_id)
    # `leaseq status` and the metrics scrape read the same view (migration 14).
    with psycopg.connect(dsn, autocommit=True) as conn:
        found = conn.execute("EXPLAIN " + client.queries["queue_stats"]).fetchall()
    plans["status:queue_stats"] = "\n".join(str(r[0]) for r in found)
    # The filter suggestions (no index leads with task or last_error_code) walk the
    # primary key backwards over the newest jobs only, a bounded read.
    for name, plan in plans.items():
        if name.endswith((":web_task_names", ":web_error_codes")):
            assert re.search(r"Index (Only )?Scan Backward using jobs_pkey", plan), plan
    scans = {
        name: plan
        for name, plan in plans.items()
        if re.search(rf"Seq Scan on (\"?{schema}\"?\.)?jobs\b", plan)
    }
    assert not scans, "sequential scans of jobs:\n" + "\n\n".join(
        f"{name}:\n{plan}" for name, plan in scans.items()
    )
