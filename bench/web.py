"""The web dashboard on a 1,000,000-job table: p50 time of each default page.

    .venv/bin/python -m bench.web [--dsn DSN] [--jobs 1000000] [--repeat 20]

One schema filled by a single ``INSERT ... SELECT generate_series`` with a history shaped
like a busy queue's (mostly succeeded, 2% dead, 2% pending, some running, cancelled, keyed
and unique jobs, the newest ones finished in the last hour), then VACUUM ANALYZE. Each
default page is fetched through Starlette's TestClient (the app's own code path: auth,
templates, every read under the statement timeout) ``--repeat`` times after one warm-up;
prints the median and the slowest. Not a timed test: figures for the closing note.

``fill_history`` and ``DEFAULT_READS`` are shared with the EXPLAIN test
(tests/integration/test_web_explain.py), which checks that none of these reads scans the
jobs table sequentially.
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings
from typing import Any

import psycopg
from psycopg import sql

import leaseq
from bench.db import connect, fresh_schema, settle
from bench.harness import resolve_bench_dsn
from leaseq.ops.web_async import SUGGEST_WINDOW, THROUGHPUT_WINDOW
from leaseq.params import job_filter

#: %s = how many rows. 10 ms apart, so the newest ~360,000 were created in the last hour.
HISTORY_ROWS = """
INSERT INTO {table} (queue_name, task, payload, status, available_at, attempt_count,
                lease_owner, lease_token, lease_expires_at, last_error_code, last_error_class,
                last_error_detail, created_at, started_at, finished_at, ordering_key,
                unique_key)
SELECT 'q' || (i %% 8), 't' || (i %% 20), jsonb_build_object('user', i %% 1000, 'n', i),
       st::{status},
       CASE WHEN st = 'pending' AND i %% 200 < 3 THEN now() + interval '1 hour' ELSE made END,
       CASE WHEN st = 'pending' THEN 0 ELSE 1 END,
       CASE WHEN st = 'running' THEN 'bench-host:1' END,
       CASE WHEN st = 'pending' THEN 0 ELSE 1 END,
       CASE WHEN st = 'running' THEN now() + interval '1 hour' END,
       CASE WHEN st = 'dead' THEN 'E' || (i %% 7) END,
       CASE WHEN st = 'dead' THEN 'permanent' END,
       CASE WHEN st = 'dead' THEN 'boom' END,
       made,
       CASE WHEN st <> 'pending' THEN made END,
       CASE WHEN st IN ('succeeded', 'dead', 'cancelled') THEN made + interval '1 second' END,
       CASE WHEN i %% 50 = 0 THEN 'acct-' || (i %% 5000) END,
       CASE WHEN i %% 10 = 0 THEN 'u-' || i END
FROM (
  SELECT i, now() - (%s - i) * interval '10 milliseconds' AS made,
         (CASE WHEN i %% 100 < 2 THEN 'dead'
               WHEN i %% 100 < 4 THEN 'pending'
               WHEN i %% 100 < 5 THEN 'cancelled'
               WHEN i %% 1000 = 999 THEN 'running'
               ELSE 'succeeded' END) AS st
  FROM generate_series(1, %s) AS i
) AS g
"""

#: The pages without any filter, as a user first opens them.
DEFAULT_PAGES = [
    "/",
    "/partials/overview",
    "/queues/q1",
    "/jobs",
    "/jobs/{id}",
    "/dead",
    "/keys",
    "/pauses",
    "/limits",
    "/workers",
    "/tasks",
    "/tasks?window=24h",
    "/dead/groups",
]

#: Filtered job lists, timed for information: a narrow filter walks the primary key
#: further (bounded by the statement timeout); the default pages above are what must stay
#: index-bounded.
FILTERED_PAGES = [
    "/jobs?state=dead",
    "/jobs?queue=q3&task=t3",
    "/jobs?error_code=E3",
    "/jobs?ordering_key=acct-100",
    "/jobs?unique_key=u-500000",
    '/jobs?payload={"user": 7}',
    "/dead?queue=q2&error_code=E2",
    "/dead?before={id}",
    "/jobs?created_after=2000-01-01T00:00&created_before=2001-01-01T00:00",
]


def fill_history(dsn: str, schema: str, count: int) -> None:
    """Untimed: ``count`` jobs of history in one statement, then VACUUM ANALYZE."""
    text = sql.SQL(HISTORY_ROWS).format(
        table=sql.Identifier(schema, "jobs"), status=sql.Identifier(schema, "job_status")
    )
    with connect(dsn) as conn:
        conn.execute(text, (count, count))
        settle(conn, schema, checkpoint=False)


def add_limits(client: leaseq.Client) -> None:
    """Six limits of every kind (the /limits page reads each one's slots and waiting)."""
    for name in ("queue:q1", "queue:q2", "task:t3", "key:acct-1", "key:tenant:*", "queue:*"):
        client.set_limit(name, concurrency=5, reason="bench")


def default_reads(job_id: int) -> list[tuple[str, dict[str, Any] | None]]:
    """Every named read the default pages send (the newer pages of issue 29 too), with
    the parameters they send."""
    no_filter = {
        "statuses": None,
        "queue": None,
        "task": None,
        "error_code": None,
        "ordering_key": None,
        "unique_key": None,
        "payload": None,
        "before": None,
        "created_after": None,
        "created_before": None,
    }
    dead = job_filter(["dead"])
    one = {"id": job_id}
    return [
        ("web_queue_stats", None),
        ("list_pauses", None),
        ("web_throughput", {"window": THROUGHPUT_WINDOW}),
        ("web_jobs", {**no_filter, "limit": 50}),
        ("web_jobs", {**no_filter, "queue": "q1", "limit": 20}),
        ("list_jobs", {**dead, "limit": 50}),
        ("web_count_dead", {**dead, "cap": 10_000}),
        ("get_job", one),
        ("job_events", one),
        ("job_effects", one),
        ("unique_key_of_job", one),
        ("web_job_ordering_key", one),
        ("blocked_keys", {"limit": 100}),
        ("list_limits", {}),
        ("web_waiting_counts", None),
        ("web_dead_jobs", {**dead, "before": None, "limit": 50}),
        ("web_dead_jobs", {**dead, "before": job_id, "limit": 50}),
        ("web_workers", None),
        ("web_task_stats", {"window": THROUGHPUT_WINDOW, "seconds": 3600.0}),
        ("web_task_stats", {"window": THROUGHPUT_WINDOW, "seconds": 86400.0}),
        ("web_dead_groups", {"queue": None}),
        ("web_state_estimates", None),
        ("web_task_names", {"window": SUGGEST_WINDOW}),
        ("web_error_codes", {"window": SUGGEST_WINDOW}),
        ("job_dependencies", one),
        ("job_dependents", {**one, "limit": 100}),
        ("job_batch", one),
        ("job_result", one),
        ("get_batch", one),
    ]


def explain(dsn: str, client: leaseq.Client, job_id: int) -> dict[str, str]:
    """The plan of each default read (EXPLAIN, with the values the page binds)."""
    plans: dict[str, str] = {}
    with psycopg.connect(dsn, autocommit=True) as conn:
        for i, (name, params) in enumerate(default_reads(job_id)):
            rows = conn.execute("EXPLAIN " + client.queries[name], params).fetchall()
            plans[f"{i}:{name}"] = "\n".join(str(r[0]) for r in rows)
    return plans


def _time_pages(dsn: str, schema: str, job_id: int, repeat: int) -> dict[str, list[float]]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Starlette asks for httpx2
        from starlette.testclient import TestClient

    from leaseq.web import create_app

    app = create_app(
        leaseq.AsyncClient(dsn, schema=schema), close_client=True, allowed_hosts=["testserver"]
    )
    took: dict[str, list[float]] = {}
    with TestClient(app) as tc:
        for page in DEFAULT_PAGES + FILTERED_PAGES:
            path = page.replace("{id}", str(job_id))
            tc.get(path)  # warm-up: connections, prepared statements, caches
            for _ in range(repeat):
                started = time.perf_counter()
                response = tc.get(path)
                took.setdefault(page, []).append(time.perf_counter() - started)
                if response.status_code != 200:
                    raise SystemExit(f"{path}: HTTP {response.status_code}")
    return took


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.web", description=__doc__)
    parser.add_argument("--dsn")
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    dsn = resolve_bench_dsn(args.dsn)
    with fresh_schema(dsn, "web") as client:
        started = time.perf_counter()
        fill_history(dsn, client.schema, args.jobs)
        add_limits(client)
        print(f"filled {args.jobs} jobs in {time.perf_counter() - started:.1f}s")
        dead = client.list_jobs("dead", limit=1)
        job_id = dead[0].job_id if dead else 1
        for page, samples in _time_pages(dsn, client.schema, job_id, args.repeat).items():
            p50 = statistics.median(samples) * 1000
            print(f"{page:30} p50 {p50:8.1f} ms   max {max(samples) * 1000:8.1f} ms")


if __name__ == "__main__":
    main()
