"""The ``schedule-ticker`` scenario: what 1,000 periodic schedules cost the workers that tick
them. Four worker processes (``--processes 4``) drain the same N no-op jobs twice, once with
``--no-schedules`` and no schedules, once ticking 1,000 schedules that each fire once a
minute, spread over the minute (``S * * * * *``, S = 0..59), so about 17 tick transactions a
second. The tick jobs go to a queue the workers do not serve, so both drains do the same
work; the ticks due before the timed drain are enqueued first, untimed (steady state).
Reported: both drain rates and their ratio, the ticks enqueued per second, and the scans of
the schedules table per second (sequential plus index scans, from ``pg_stat_user_tables``:
per schema, so other sessions on the server do not count)."""

from __future__ import annotations

import time

from bench.db import connect, fill_queue, fresh_schema
from bench.harness import (
    TASK,
    BenchError,
    Metric,
    Ratio,
    Sample,
    Scenario,
    Settings,
    leaseq_root,
    run_burst_worker,
)

SCHEDULES = 1000
PROCESSES = 4


def _schedule_reads(settings: Settings, schema: str) -> int:
    with connect(settings.dsn) as conn:
        row = conn.execute(
            "SELECT coalesce(seq_scan, 0) + coalesce(idx_scan, 0) FROM pg_stat_user_tables"
            " WHERE schemaname = %s AND relname = 'schedules'",
            (schema,),
        ).fetchone()
    return int(row[0]) if row else 0


def _ticks(settings: Settings, schema: str) -> int:
    with connect(settings.dsn) as conn:
        row = conn.execute(f'SELECT count(*) FROM "{schema}".schedule_ticks').fetchone()
    return int(row[0]) if row else 0


def _drain(settings: Settings, ticking: bool) -> tuple[Sample, Sample, Sample]:
    name = "schedule-ticker-on" if ticking else "schedule-ticker-off"
    with fresh_schema(settings.dsn, name) as client:
        fill_queue(settings.dsn, client, settings.jobs)
        options: tuple[str, ...] = ("--processes", str(PROCESSES))
        if ticking:
            for i in range(SCHEDULES):
                client.schedule_add(
                    f"bench-{i}", task=TASK, cron=f"{i % 60} * * * * *", queue="ticks"
                )
            # Steady state: the ticks due since the schedules were added are enqueued now,
            # untimed, so the timed drain sees only the ticks of its own seconds.
            client.tick_schedules(limit=2 * SCHEDULES)
        else:
            options += ("--no-schedules",)
        reads = _schedule_reads(settings, client.schema)
        ticks_before = _ticks(settings, client.schema)
        wall, lines = run_burst_worker(settings, client.schema, *options, cwd=leaseq_root())
        processed = sum(int(m["jobs"]) for m in lines)
        if processed != settings.jobs:
            raise BenchError(f"{PROCESSES} workers processed {processed} of {settings.jobs}")
        time.sleep(0.6)  # exited backends have flushed their table statistics by now
        reads = _schedule_reads(settings, client.schema) - reads
        ticks = _ticks(settings, client.schema) - ticks_before
    return Sample(processed, wall), Sample(reads, wall), Sample(ticks, wall)


def schedule_ticker(settings: Settings) -> dict[str, Sample]:
    off, _, _ = _drain(settings, ticking=False)
    on, reads, ticks = _drain(settings, ticking=True)
    return {
        "schedule-ticker-off": off,
        "schedule-ticker-on": on,
        "schedule-ticker-reads": reads,
        "schedule-ticker-ticks": ticks,
    }


NAME = "schedule-ticker"
SCENARIO = Scenario(
    NAME,
    f"{PROCESSES} burst workers drain N no-op jobs with and without ticking "
    f"{SCHEDULES} once-a-minute schedules",
    (
        Metric("schedule-ticker-off", NAME, f"{PROCESSES} workers, --no-schedules, wall"),
        Metric("schedule-ticker-on", NAME, f"{PROCESSES} workers ticking {SCHEDULES}, wall"),
        Metric("schedule-ticker-reads", NAME, "scans of the schedules table", "scans/s"),
        Metric("schedule-ticker-ticks", NAME, "tick jobs enqueued", "ticks/s"),
    ),
    schedule_ticker,
)
RATIOS = (
    Ratio(
        "drain with 1,000 schedules ticking / without (target >= 0.95)",
        "schedule-ticker-on",
        "schedule-ticker-off",
    ),
)
