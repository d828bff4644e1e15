"""The ``claim-vs-backlog`` scenario: claim+complete round trips at growing pending
backlogs (each kept at its size by untimed refills), one EXPLAIN of a claim at the largest
backlog, and the ratios comparing each backlog with the smallest."""

from __future__ import annotations

import datetime as dt
import os
import pathlib
import time
from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg import sql

from bench.db import (
    CLAIM_LIMIT,
    PENDING_ROWS,
    claim_and_complete,
    claim_params,
    connect,
    fresh_schema,
    insert_rows,
    jobs_table,
    settle,
    status_counts,
)
from bench.harness import (
    DEFAULT_BACKLOGS,
    BenchError,
    Metric,
    Ratio,
    Sample,
    Scenario,
    Settings,
    ms,
    percentile,
    size_label,
)
from bench.report import display_path
from leaseq.dsn import describe_dsn
from leaseq.sql import Queries

NAME = "claim-vs-backlog"


def explain_path(settings: Settings) -> pathlib.Path:
    return settings.results_dir / f"claim-explain-{size_label(max(settings.backlogs))}.txt"


def write_explain(
    settings: Settings,
    conn: psycopg.Connection[Any],
    claim: str,
    params: dict[str, Any],
    backlog: int,
) -> None:
    """EXPLAIN (ANALYZE, BUFFERS) of one claim, in a transaction that is rolled back."""
    with conn.transaction(force_rollback=True):
        rows = conn.execute("EXPLAIN (ANALYZE, BUFFERS) " + claim, params).fetchall()
    path = explain_path(settings)
    path.parent.mkdir(parents=True, exist_ok=True)
    header = [
        f"-- claim_jobs (LIMIT {params['limit']}) with a backlog of {backlog:,} pending jobs",
        f"-- {dt.datetime.now(dt.UTC).isoformat(timespec='seconds')}, "
        f"{describe_dsn(settings.dsn)}, after {settings.claims:,} timed claims; "
        "run once, rolled back",
        "",
    ]
    path.write_text("\n".join([*header, *(str(row[0]) for row in rows)]) + "\n")


def claim_vs_backlog(settings: Settings) -> dict[str, Sample]:
    """For each backlog size B (a fresh schema each): B pending jobs, then K timed
    claim_jobs (LIMIT 10) + complete_jobs round trips. After each round trip, untimed,
    as many new pending jobs are inserted as were completed, so the backlog stays B."""
    out: dict[str, Sample] = {}
    for backlog in settings.backlogs:
        with fresh_schema(settings.dsn, NAME) as client:
            schema = client.schema
            queries = Queries(schema)
            claim, complete = queries["claim_jobs"], queries["complete_jobs"]
            params = claim_params(f"bench-backlog:{os.getpid()}", CLAIM_LIMIT)
            refill = sql.SQL(PENDING_ROWS).format(jobs_table(schema))
            latencies: list[float] = []
            claim_only: list[float] = []
            with connect(settings.dsn) as conn:
                insert_rows(conn, schema, PENDING_ROWS, backlog)
                settle(conn, schema, settings.checkpoint)
                for _ in range(settings.claims):
                    t0 = time.perf_counter()
                    n, claim_seconds = claim_and_complete(conn, claim, complete, params)
                    latencies.append(time.perf_counter() - t0)
                    claim_only.append(claim_seconds)
                    if n != min(CLAIM_LIMIT, backlog):
                        raise BenchError(f"a claim from a backlog of {backlog} completed {n}")
                    conn.execute(refill, (n,))
                if backlog == max(settings.backlogs):
                    write_explain(settings, conn, claim, params, backlog)
            counts = status_counts(settings.dsn, schema)
        if counts.get("pending") != backlog or counts.get("succeeded") != len(latencies) * min(
            CLAIM_LIMIT, backlog
        ):
            raise BenchError(f"claim-vs-backlog {backlog}: unexpected table state {counts}")
        seconds = sum(latencies)
        label = size_label(backlog)
        out[f"cvb-{label}-rate"] = Sample(len(latencies), seconds)
        out[f"cvb-{label}-p50"] = Sample(len(latencies), seconds, ms(percentile(latencies, 50)))
        out[f"cvb-{label}-p99"] = Sample(len(latencies), seconds, ms(percentile(latencies, 99)))
        out[f"cvb-{label}-claim"] = Sample(
            len(claim_only), sum(claim_only), ms(percentile(claim_only, 50))
        )
    return out


def explain_note(settings: Settings) -> str:
    """The report's last line when the scenario ran: where the EXPLAIN went."""
    return (
        f"{NAME}: EXPLAIN (ANALYZE, BUFFERS) of one claim at backlog "
        f"{size_label(max(settings.backlogs))} (last round): {display_path(explain_path(settings))}"
    )


def scenario(backlogs: Sequence[int] = DEFAULT_BACKLOGS) -> Scenario:
    metrics = tuple(
        Metric(f"cvb-{size_label(b)}-{what}", NAME, f"backlog {size_label(b)}, {text}", unit)
        for b in backlogs
        for what, text, unit in (
            ("rate", f"claim+complete, LIMIT {CLAIM_LIMIT}", "claims/s"),
            ("p50", "claim+complete latency p50", "ms"),
            ("p99", "claim+complete latency p99", "ms"),
            ("claim", "claim_jobs alone (its commit included), p50", "ms"),
        )
    )
    return Scenario(
        NAME,
        "claim_jobs (LIMIT 10) + complete_jobs round trips at growing pending backlogs",
        metrics,
        claim_vs_backlog,
    )


def ratios(backlogs: Sequence[int] = DEFAULT_BACKLOGS) -> tuple[Ratio, ...]:
    """Each larger backlog against the smallest."""
    out: list[Ratio] = []
    base = min(backlogs)
    for big in sorted(b for b in backlogs if b != base):
        pair = f"{size_label(big)}/{size_label(base)}"
        target = " (target <= 1.5)" if (base, big) == (10_000, 1_000_000) else ""
        b, s = size_label(big), size_label(base)
        out += [
            Ratio(
                f"claim+complete mean time, backlog {pair}{target}",
                f"cvb-{b}-rate",
                f"cvb-{s}-rate",
                inverse=True,
            ),
            Ratio(f"claim+complete p50, backlog {pair}", f"cvb-{b}-p50", f"cvb-{s}-p50"),
            Ratio(f"claim+complete p99, backlog {pair}", f"cvb-{b}-p99", f"cvb-{s}-p99"),
            Ratio(f"claim_jobs alone p50, backlog {pair}", f"cvb-{b}-claim", f"cvb-{s}-claim"),
        ]
    return tuple(out)
