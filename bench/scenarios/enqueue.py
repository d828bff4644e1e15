"""Enqueue scenarios: single-row and bulk inserts, raw SQL (``enqueue-single-raw``,
``enqueue-bulk-raw``) against the client (``enqueue-single``, ``enqueue-bulk``), with the
ratios that compare each pair."""

from __future__ import annotations

import time

from psycopg import sql

import leaseq
from bench.db import (
    RAW_BULK_INSERT,
    RAW_SINGLE_INSERT,
    connect,
    fresh_schema,
    jobs_table,
    payload_json,
)
from bench.harness import QUEUE, TASK, Metric, Ratio, Sample, Scenario, Settings

ENQUEUE_CHUNK = 1000  # the chunk size of the "chunks" enqueue figures


def chunks(n: int, size: int) -> list[range]:
    return [range(start, min(start + size, n)) for start in range(0, n, size)]


def enqueue_single_raw(settings: Settings) -> dict[str, Sample]:
    """M single-row inserts on one autocommit connection, each its own transaction."""
    with fresh_schema(settings.dsn, "enqueue-single-raw") as client:
        insert = sql.SQL(RAW_SINGLE_INSERT).format(jobs_table(client.schema))
        with connect(settings.dsn) as conn:
            started = time.perf_counter()
            for i in range(settings.single):
                conn.execute(insert, (QUEUE, TASK, payload_json(i))).fetchone()
            elapsed = time.perf_counter() - started
    return {"enqueue-single-raw": Sample(settings.single, elapsed)}


def enqueue_single(settings: Settings) -> dict[str, Sample]:
    """M ``Client.enqueue`` calls (sync client), each its own transaction."""
    with fresh_schema(settings.dsn, "enqueue-single") as client:
        started = time.perf_counter()
        for i in range(settings.single):
            client.enqueue(TASK, {"n": i}, queue=QUEUE)
        elapsed = time.perf_counter() - started
    return {"enqueue-single": Sample(settings.single, elapsed)}


def enqueue_bulk_raw(settings: Settings) -> dict[str, Sample]:
    """Plain ``INSERT ... SELECT FROM unnest(jsonb[]) RETURNING id``: chunks of 1000, and
    all N in one statement (each in its own fresh schema)."""
    out: dict[str, Sample] = {}
    for key, size in (
        ("enqueue-bulk-raw-chunks", ENQUEUE_CHUNK),
        ("enqueue-bulk-raw-all", settings.jobs),
    ):
        with fresh_schema(settings.dsn, "enqueue-bulk-raw") as client:
            insert = sql.SQL(RAW_BULK_INSERT).format(jobs_table(client.schema))
            with connect(settings.dsn) as conn:
                started = time.perf_counter()
                for chunk in chunks(settings.jobs, size):
                    payloads = [payload_json(i) for i in chunk]
                    conn.execute(insert, (QUEUE, TASK, payloads)).fetchall()
                elapsed = time.perf_counter() - started
        out[key] = Sample(settings.jobs, elapsed)
    return out


def enqueue_bulk(settings: Settings) -> dict[str, Sample]:
    """``Client.enqueue_many``: chunks of 1000, and all N in one call (each in its own
    fresh schema). The JobSpec objects are built before the clock starts; validation and
    encoding happen inside enqueue_many, so they are timed."""
    out: dict[str, Sample] = {}
    for key, size in (("enqueue-bulk-chunks", ENQUEUE_CHUNK), ("enqueue-bulk-all", settings.jobs)):
        with fresh_schema(settings.dsn, "enqueue-bulk") as client:
            batches = [
                [leaseq.JobSpec(TASK, {"n": i}, queue=QUEUE) for i in chunk]
                for chunk in chunks(settings.jobs, size)
            ]
            started = time.perf_counter()
            for batch in batches:
                client.enqueue_many(batch)
            elapsed = time.perf_counter() - started
        out[key] = Sample(settings.jobs, elapsed)
    return out


SCENARIOS = (
    Scenario(
        "enqueue-single-raw",
        "M single-row INSERT ... RETURNING id, autocommit, one connection",
        (Metric("enqueue-single-raw", "enqueue-single-raw", "INSERT ... RETURNING id, 1 conn"),),
        enqueue_single_raw,
    ),
    Scenario(
        "enqueue-single",
        "M Client.enqueue calls (sync client)",
        (Metric("enqueue-single", "enqueue-single", "Client.enqueue"),),
        enqueue_single,
    ),
    Scenario(
        "enqueue-bulk-raw",
        "N rows by INSERT ... SELECT unnest(jsonb[]): chunks of 1000, and all at once",
        (
            Metric(
                "enqueue-bulk-raw-chunks",
                "enqueue-bulk-raw",
                f"unnest insert, {ENQUEUE_CHUNK}/stmt",
            ),
            Metric("enqueue-bulk-raw-all", "enqueue-bulk-raw", "unnest insert, N in 1 stmt"),
        ),
        enqueue_bulk_raw,
    ),
    Scenario(
        "enqueue-bulk",
        "N jobs by Client.enqueue_many: chunks of 1000, and all at once",
        (
            Metric("enqueue-bulk-chunks", "enqueue-bulk", f"enqueue_many, {ENQUEUE_CHUNK}/call"),
            Metric("enqueue-bulk-all", "enqueue-bulk", "enqueue_many, N in 1 call"),
        ),
        enqueue_bulk,
    ),
)

RATIOS = (
    Ratio("leaseq single enqueue / raw insert", "enqueue-single", "enqueue-single-raw"),
    Ratio(
        f"leaseq bulk enqueue / raw bulk insert ({ENQUEUE_CHUNK}/stmt)",
        "enqueue-bulk-chunks",
        "enqueue-bulk-raw-chunks",
    ),
    Ratio(
        "leaseq bulk enqueue / raw bulk insert (N in 1)",
        "enqueue-bulk-all",
        "enqueue-bulk-raw-all",
    ),
)
