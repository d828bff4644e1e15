"""``drain-minimal``: the limit of the problem, the seed's minimal table and statements
(bench/minimal.py) drained by 1, 2 or 4 processes at batch 100 and 10, the same
configurations as ``drain-raw`` (leaseq's own statements on leaseq's table). The best
configuration per clock is the **minimal limit**.

Its ratios split leaseq's gap into its two causes (issue 35):
- own statements / minimal: leaseq's schema and SQL against the seed's (same process
  counts and batch, per configuration, and best against best);
- leaseq / own statements: the worker's Python (the ``drain-raw`` ratios of
  bench/scenarios/drain.py);
- leaseq / minimal: the two together.
"""

from __future__ import annotations

import json
import sys

from bench import minimal
from bench.db import connect, drop_schema, new_schema_name
from bench.harness import (
    BenchError,
    Metric,
    Ratio,
    Sample,
    Scenario,
    Series,
    Settings,
    run_processes,
    worker_env,
)
from bench.scenarios.drain import (
    CLOCKS,
    RAW_BATCHES,
    RAW_LIMIT,
    RAW_PROCESSES,
    adopt_best,
    best_of,
    raw_config,
    raw_key,
)

NAME = "drain-minimal"
LIMIT = "drain-minimal-limit"


def key(processes: int, batch: int, clock: str) -> str:
    return f"{NAME}-{processes}p-b{batch}-{clock}"


def _last_finished(dsn: str, schema: str) -> float:
    text = minimal._text(
        "SELECT extract(epoch FROM max(finished_at))::float8, count(*) FILTER "
        "(WHERE status = 'succeeded'), count(*) FROM {schema}.jobs",
        schema,
    )
    with connect(dsn) as conn:
        row = conn.execute(text).fetchone()
    if row is None or row[0] is None or row[1] != row[2]:
        raise BenchError(f"the minimal drain left work undone in {schema}")
    return float(row[0])


def minimal_drain(
    settings: Settings,
    jobs: int,
    processes: int,
    batch: int,
    *,
    queues: int = 1,
    pad: int = 0,
    payload: bool = False,
) -> tuple[Sample, Sample]:
    """One drain of the seed's table, filled untimed with ``jobs`` jobs (over ``queues``
    queues, payloads padded by ``pad``), by ``processes`` ``bench.minimal`` processes at
    ``batch``: (start-up excluded, process wall). Checks that every job succeeded once."""
    schema = new_schema_name(NAME)
    try:
        with connect(settings.dsn) as conn:
            conn.execute(f'CREATE SCHEMA "{schema}"')
            minimal.create(conn, schema)
            minimal.load(conn, schema, jobs, pad=pad, queues=queues)
        command = [sys.executable, "-P", "-m", "bench.minimal"]
        command += ["--schema", schema, "--batch", str(batch), "--queues", str(queues)]
        command += ["--payload"] if payload else []
        wall, outputs = run_processes([command] * processes, worker_env(settings.dsn, schema))
        lines = [json.loads(o.splitlines()[-1]) for o in outputs]
        processed = sum(int(line["processed"]) for line in lines)
        if processed != jobs:
            raise BenchError(f"minimal drain processed {processed} of {jobs}")
        db = _last_finished(settings.dsn, schema) - min(float(x["first_claim"]) for x in lines)
    finally:
        drop_schema(settings.dsn, schema)
    return Sample(processed, db), Sample(processed, wall)


def drain_minimal(settings: Settings) -> dict[str, Sample]:
    samples: dict[str, Sample] = {}
    for batch in RAW_BATCHES:
        for processes in RAW_PROCESSES:
            db, wall = minimal_drain(settings, settings.jobs, processes, batch)
            samples[key(processes, batch, "db")] = db
            samples[key(processes, batch, "wall")] = wall
    return samples


def best(series: dict[str, Series], clock: str) -> str | None:
    """The minimal configuration with the highest median on ``clock``, or None."""
    return best_of(series, [key(p, b, clock) for b in RAW_BATCHES for p in RAW_PROCESSES])


def finish(series: dict[str, Series]) -> None:
    """After the rounds: the minimal limit, per clock, is its best configuration."""
    for clock in CLOCKS:
        won = best(series, clock)
        if won is not None:
            config = raw_config(won.replace(NAME, "drain-raw"))
            label = f"minimal limit, {CLOCKS[clock]} = best: {config}"
            adopt_best(series, f"{LIMIT}-{clock}", won, label)


SCENARIO = Scenario(
    NAME,
    "the seed's minimal table and statements: CTE claim + fenced unnest completion, 1/2/4 "
    "processes, batch 100/10",
    (
        *(
            Metric(
                key(p, b, clock),
                NAME,
                f"minimal {raw_config(raw_key(p, b, clock))}, {label}",
            )
            for b in RAW_BATCHES
            for p in RAW_PROCESSES
            for clock, label in CLOCKS.items()
        ),
        *(Metric(f"{LIMIT}-{c}", NAME, f"minimal limit, {label}") for c, label in CLOCKS.items()),
    ),
    drain_minimal,
    finish=finish,
)


def _ratios() -> list[Ratio]:
    out: list[Ratio] = []
    for clock, label in CLOCKS.items():
        target = " (target >= 0.85)" if clock == "db" else ""
        out.append(
            Ratio(
                f"own statements / minimal, best vs best, {label}{target}",
                f"{RAW_LIMIT}-{clock}",
                f"{LIMIT}-{clock}",
            )
        )
        for b in RAW_BATCHES:
            for p in RAW_PROCESSES:
                out.append(
                    Ratio(
                        f"own statements / minimal, {raw_config(raw_key(p, b, clock))}, {label}",
                        raw_key(p, b, clock),
                        key(p, b, clock),
                    )
                )
        for name, what, goal in (
            ("drain-leaseq", "async 1p", ""),
            ("drain-leaseq-2p", "async 2p", " (target >= 0.8)"),
            ("drain-leaseq-sync-2p", "sync 2p", ""),
            # The batched mode, beside graphile-worker's (opt-in, --only).
            ("drain-leaseq-adaptive-2p", "async 2p --adaptive-batch", ""),
        ):
            goal = goal if clock == "db" else ""
            out.append(
                Ratio(
                    f"leaseq {what} / minimal limit, {label}{goal}",
                    f"{name}-{clock}",
                    f"{LIMIT}-{clock}",
                )
            )
    return out


RATIOS = tuple(_ratios())
