"""Database helpers of the benchmark: connections, fresh and empty schemas, seeding jobs
(through the client, or straight into the table with ``generate_series``), settling a
filled table, checking what a scenario left behind, and the raw-SQL baseline statements
that leaseq is compared with (leaseq's own claim/complete texts, plain inserts).
"""

from __future__ import annotations

import contextlib
import json
import secrets
import time
from collections.abc import Iterator, Sequence
from typing import Any, Final

import psycopg
from psycopg import sql

import leaseq
from bench.harness import QUEUE, TASK, BenchError
from bench.minimal import pad_text
from leaseq.params import text_array

PREP_CHUNK = 5000  # untimed enqueue_many chunks that fill the queue before a drain
CLAIM_LIMIT = 10  # LIMIT of the claim in claim-under-prune and claim-vs-backlog

# Rows written straight into {schema}.jobs with generate_series (untimed set-up that is
# much faster than enqueue_many for 10^5-10^6 rows). %s is the row count.
PENDING_ROWS: Final = """
INSERT INTO {} (queue_name, task, payload)
SELECT 'default', 'noop', jsonb_build_object('n', g) FROM generate_series(1, %s::int) AS g
"""
OLD_SUCCEEDED_ROWS: Final = """
INSERT INTO {} (queue_name, task, payload, status, attempt_count, lease_token,
                created_at, available_at, started_at, finished_at)
SELECT 'default', 'noop', jsonb_build_object('n', g), 'succeeded', 1, 1,
       now() - interval '10 days 2 minutes', now() - interval '10 days 2 minutes',
       now() - interval '10 days 1 minute', now() - interval '10 days'
FROM generate_series(1, %s::int) AS g
"""
EXPIRED_LEASE_ROWS: Final = """
INSERT INTO {} (queue_name, task, payload, status, attempt_count, lease_token, lease_owner,
                lease_expires_at, started_at, heartbeat_at)
SELECT 'default', 'noop', jsonb_build_object('n', g), 'running', 1, 1, 'gone',
       now() - interval '1 second', now() - interval '1 minute', now() - interval '1 minute'
FROM generate_series(1, %s::int) AS g
"""

# The raw-SQL enqueue baselines: what an insert costs without leaseq's client around it.
RAW_SINGLE_INSERT: Final = (
    "INSERT INTO {} (queue_name, task, payload) VALUES (%s, %s, %s::jsonb) RETURNING id"
)
RAW_BULK_INSERT: Final = (
    "INSERT INTO {} (queue_name, task, payload) "
    "SELECT %s, %s, p FROM unnest(%s::jsonb[]) AS u(p) RETURNING id"
)


def connect(dsn: str) -> psycopg.Connection[Any]:
    return psycopg.connect(dsn, autocommit=True, application_name="leaseq-bench")


def new_schema_name(scenario: str) -> str:
    return f"bench_{scenario.replace('-', '_')}_{secrets.token_hex(4)}"


def drop_schema(dsn: str, schema: str) -> None:
    with connect(dsn) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


@contextlib.contextmanager
def fresh_schema(dsn: str, scenario: str, **options: Any) -> Iterator[leaseq.Client]:
    """A newly migrated schema and a sync client on it (with ``options``, e.g.
    offload_above); the schema is dropped afterwards."""
    schema = new_schema_name(scenario)
    client = leaseq.Client(dsn, schema=schema, **options)
    try:
        client.migrate()  # also opens the client's pool, so no sample pays for connecting
        yield client
    finally:
        client.close()
        drop_schema(dsn, schema)


@contextlib.contextmanager
def empty_schema(dsn: str, scenario: str) -> Iterator[str]:
    """An empty schema (for a peer queue's tables); dropped with everything in it."""
    schema = new_schema_name(scenario)
    with connect(dsn) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    try:
        yield schema
    finally:
        drop_schema(dsn, schema)


def jobs_table(schema: str) -> sql.Composed:
    return sql.SQL("{}.jobs").format(sql.Identifier(schema))


def vacuum_analyze(conn: psycopg.Connection[Any], schema: str) -> None:
    conn.execute(sql.SQL("VACUUM (ANALYZE) {}").format(jobs_table(schema)))


def may_checkpoint(dsn: str) -> bool:
    """Superusers and members of pg_checkpoint may run CHECKPOINT."""
    with connect(dsn) as conn:
        row = conn.execute(
            "SELECT rolsuper OR pg_has_role(current_user, 'pg_checkpoint', 'member') "
            "FROM pg_roles WHERE rolname = current_user"
        ).fetchone()
    return bool(row and row[0])


def settle(conn: psycopg.Connection[Any], schema: str, checkpoint: bool) -> None:
    """Untimed, after a bulk fill: VACUUM (ANALYZE), then CHECKPOINT when allowed, so the
    checkpointer is not still writing out the fill (up to ~200 MB) while the clock runs."""
    vacuum_analyze(conn, schema)
    if checkpoint:
        conn.execute("CHECKPOINT")


def insert_rows(conn: psycopg.Connection[Any], schema: str, template: str, count: int) -> None:
    """Untimed: ``count`` rows of one of the *_ROWS shapes, in one statement."""
    conn.execute(sql.SQL(template).format(jobs_table(schema)), (count,))


def fill_queue(
    dsn: str,
    client: leaseq.Client,
    jobs: int,
    task: str = TASK,
    queues: Sequence[str] = (QUEUE,),
    pad: int = 0,
) -> None:
    """Untimed: ``jobs`` pending no-op jobs (spread round-robin over ``queues``; with
    ``pad``, each payload carries that many incompressible characters more), then VACUUM
    ANALYZE so every drain starts alike."""
    filler = pad_text(pad) if pad else None
    chunk = PREP_CHUNK if pad < 10_000 else 100  # a chunk of 100 KB payloads stays small
    for start in range(0, jobs, chunk):
        count = min(chunk, jobs - start)
        client.enqueue_many(
            leaseq.JobSpec(
                task,
                {"n": n} if filler is None else {"n": n, "pad": filler},
                queue=queues[n % len(queues)],
            )
            for n in range(start, start + count)
        )
    with connect(dsn) as conn:
        vacuum_analyze(conn, client.schema)


def _where_queue(queue: str | None) -> sql.Composable:
    return sql.SQL("") if queue is None else sql.SQL(" WHERE queue_name = {}").format(queue)


def status_counts(dsn: str, schema: str, queue: str | None = None) -> dict[str, int]:
    """Jobs per status (of one queue, if given)."""
    query = sql.SQL("SELECT status::text, count(*) FROM {}{} GROUP BY status").format(
        jobs_table(schema), _where_queue(queue)
    )
    with connect(dsn) as conn:
        rows = conn.execute(query).fetchall()
    return {str(status): int(count) for status, count in rows}


def check_drained(dsn: str, schema: str, jobs: int, queue: str | None = None) -> None:
    counts = status_counts(dsn, schema, queue)
    succeeded, total = counts.get("succeeded", 0), sum(counts.values())
    if succeeded != jobs or total != jobs:
        raise BenchError(
            f"drain left work undone: {succeeded} of {total} jobs succeeded, {jobs} were enqueued"
        )


def drain_span(dsn: str, schema: str, queue: str | None = None) -> tuple[float, float]:
    """The drain on the database's clock (epoch seconds), start-up left out: the first
    claim and the last completion, ``min(started_at)`` and ``max(finished_at)`` over the
    jobs (of one queue, if given; each is the start of the transaction that wrote it). The
    peers are timed alike from their own tables (bench/scenarios/peer_drains.py)."""
    query = sql.SQL(
        "SELECT extract(epoch FROM min(started_at))::float8, "
        "extract(epoch FROM max(finished_at))::float8 FROM {}{}"
    ).format(jobs_table(schema), _where_queue(queue))
    with connect(dsn) as conn:
        row = conn.execute(query).fetchone()
    if row is None or row[0] is None or row[1] is None or row[1] <= row[0]:
        raise BenchError(f"no drain to time in {schema}.jobs")
    return float(row[0]), float(row[1])


def drain_clock(dsn: str, schema: str, queue: str | None = None) -> float:
    """The drain's seconds, start-up excluded (see ``drain_span``)."""
    start, end = drain_span(dsn, schema, queue)
    return end - start


def server_info(dsn: str) -> dict[str, Any]:
    with connect(dsn) as conn:
        row = conn.execute(
            "SELECT current_setting('server_version'), current_setting('fsync'), "
            "current_setting('synchronous_commit'), current_setting('shared_buffers'), "
            "current_setting('max_connections')"
        ).fetchone()
    assert row is not None
    names = ("server_version", "fsync", "synchronous_commit", "shared_buffers", "max_connections")
    return dict(zip(names, row, strict=True))


def claim_params(owner: str, limit: int) -> dict[str, Any]:
    return {"queue": QUEUE, "owner": owner, "lease_seconds": 60.0, "limit": limit}


def claim_and_complete(
    conn: psycopg.Connection[Any], claim: str, complete: str, params: dict[str, Any]
) -> tuple[int, float]:
    """One claim_jobs statement and, if it claimed anything, one fenced complete_jobs for
    what it claimed: (how many jobs were completed, seconds the claim statement took)."""
    started = time.perf_counter()
    rows = conn.execute(claim, params).fetchall()
    claim_seconds = time.perf_counter() - started
    if not rows:
        return 0, claim_seconds
    rows.sort(key=lambda row: row[0])  # the fence wants ascending ids (_owned_by_token)
    fence = {  # array literals: as the client sends them (psycopg's list dumper is slow)
        "ids": "{" + ",".join(str(row[0]) for row in rows) + "}",
        "tokens": "{" + ",".join(str(row[1]) for row in rows) + "}",
        # Per job, as the client sends them: every claim has an owner of its own.
        "owners": text_array(row[2] for row in rows),
    }
    return len(conn.execute(complete, fence).fetchall()), claim_seconds


def payload_json(i: int) -> str:
    """The payload every benchmark job carries, as the raw baselines send it."""
    return json.dumps({"n": i})
