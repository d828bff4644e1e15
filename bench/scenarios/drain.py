"""Drain scenarios: the raw-SQL drain limit (``drain-raw``: the best of several process
counts and batch sizes) and real ``leaseq worker --burst`` drains with async and sync no-op
handlers at 1 and 2 processes (``drain-leaseq``, ``drain-leaseq-sync``, ``-2p``), with the
ratios that compare them.

Every drain is timed on two clocks, the same for every system: **start-up excluded** (the
database's clock, from the first claim to the last completion: ``bench.db.drain_clock``)
and **process wall** (from spawning the first process to the exit of the last one).
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import sys

from bench.db import check_drained, drain_clock, fill_queue, fresh_schema
from bench.harness import (
    SYNC_TASK,
    TASK,
    BenchError,
    Metric,
    Ratio,
    Sample,
    Scenario,
    Series,
    Settings,
    leaseq_root,
    run_burst_worker,
    run_processes,
    worker_env,
)

RAW_PROCESSES = (1, 2, 4)  # raw drain processes, one connection each
RAW_BATCHES = (100, 10)  # claim sizes of the raw drain
CLOCKS = {"db": "start-up excluded", "wall": "process wall"}
RAW_LIMIT = "drain-raw-limit"  # metric key prefix: the best raw configuration, per clock


def raw_key(processes: int, batch: int, clock: str) -> str:
    return f"drain-raw-{processes}p-b{batch}-{clock}"


def raw_config(key: str) -> str:
    """``drain-raw-4p-b100-db`` -> ``4 processes, batch 100``."""
    procs, batch = key.removeprefix("drain-raw-").split("-")[:2]
    n = int(procs.removesuffix("p"))
    return f"{n} process{'es' if n > 1 else ''}, batch {batch.removeprefix('b')}"


def drain_raw(settings: Settings) -> dict[str, Sample]:
    """The raw limit: ``python -m bench.rawdrain`` (leaseq's claim_jobs + fenced
    complete_jobs in a tight loop, one connection each) at every process count and batch."""
    samples: dict[str, Sample] = {}
    for batch in RAW_BATCHES:
        for processes in RAW_PROCESSES:
            with fresh_schema(settings.dsn, "drain-raw") as client:
                fill_queue(settings.dsn, client, settings.jobs)
                command = [sys.executable, "-P", "-m", "bench.rawdrain"]
                command += ["--schema", client.schema, "--batch", str(batch)]
                env = worker_env(settings.dsn, client.schema)
                wall, outputs = run_processes([command] * processes, env)
                processed = sum(int(json.loads(o.splitlines()[-1])["processed"]) for o in outputs)
                if processed != settings.jobs:
                    raise BenchError(f"raw drain processed {processed} of {settings.jobs}")
                check_drained(settings.dsn, client.schema, settings.jobs)
                db = drain_clock(settings.dsn, client.schema)
            samples[raw_key(processes, batch, "db")] = Sample(processed, db)
            samples[raw_key(processes, batch, "wall")] = Sample(processed, wall)
    return samples


def best_of(series: dict[str, Series], keys: list[str]) -> str | None:
    """Of ``keys``, the configuration with the highest median, or None if none ran."""
    ran = [k for k in keys if k in series and series[k].samples]
    return max(ran, key=lambda k: statistics.median(series[k].figures())) if ran else None


def best_raw(series: dict[str, Series], clock: str) -> str | None:
    """The raw configuration with the highest median on ``clock``, or None if none ran."""
    return best_of(series, [raw_key(p, b, clock) for b in RAW_BATCHES for p in RAW_PROCESSES])


def adopt_best(series: dict[str, Series], target_key: str, best: str | None, label: str) -> None:
    """A limit's series takes the samples of its best configuration, named in its label."""
    target = series.get(target_key)
    if best is None or target is None:
        return
    target.samples = list(series[best].samples)
    target.metric = dataclasses.replace(target.metric, label=label)


def finish_raw(series: dict[str, Series]) -> None:
    """After all the rounds: the raw limit, per clock, is its best configuration."""
    for clock in CLOCKS:
        best = best_raw(series, clock)
        if best is not None:
            label = f"raw limit, {CLOCKS[clock]} = best: {raw_config(best)}"
            adopt_best(series, f"{RAW_LIMIT}-{clock}", best, label)


def leaseq_drain(
    settings: Settings, name: str, task: str, processes: int, extra: tuple[str, ...] = ()
) -> dict[str, Sample]:
    """A real ``leaseq worker --burst`` (``--processes N`` above 1, then ``extra``) on N
    no-op jobs."""
    with fresh_schema(settings.dsn, name) as client:
        fill_queue(settings.dsn, client, settings.jobs, task=task)
        options: tuple[str, ...] = ("--processes", str(processes)) if processes > 1 else ()
        options += extra
        # The supervisor starts its children as `python -m leaseq` without -P, so their
        # sys.path begins with the working directory: run them in the directory leaseq
        # was imported from, so they import the same leaseq as this process.
        wall, lines = run_burst_worker(settings, client.schema, *options, cwd=leaseq_root())
        processed = sum(int(m["jobs"]) for m in lines)
        succeeded = sum(int(m["succeeded"]) for m in lines)
        if len(lines) != processes or processed != settings.jobs or succeeded != settings.jobs:
            raise BenchError(
                f"{processes} worker process(es) processed {processed} of {settings.jobs}: "
                + "; ".join(m[0] for m in lines)
            )
        check_drained(settings.dsn, client.schema, settings.jobs)
        db = drain_clock(settings.dsn, client.schema)
    return {f"{name}-db": Sample(processed, db), f"{name}-wall": Sample(processed, wall)}


def drain_scenario(
    name: str, task: str, processes: int, what: str, extra: tuple[str, ...] = ()
) -> Scenario:
    def fn(settings: Settings) -> dict[str, Sample]:
        return leaseq_drain(settings, name, task, processes, extra)

    flag = f" --processes {processes}" if processes > 1 else ""
    flag += "".join(f" {e}" for e in extra)
    return Scenario(
        name,
        f"`leaseq worker --burst{flag}` draining N no-op jobs, {what} handler",
        tuple(
            Metric(f"{name}-{clock}", name, f"leaseq {what}, {processes}p, {label}")
            for clock, label in CLOCKS.items()
        ),
        fn,
    )


RAW = Scenario(
    "drain-raw",
    "raw-SQL drain limit: claim_jobs + complete_jobs loops, 1/2/4 processes, batch 100/10",
    (
        *(
            Metric(
                raw_key(p, b, clock),
                "drain-raw",
                f"raw {raw_config(raw_key(p, b, clock))}, {label}",
            )
            for b in RAW_BATCHES
            for p in RAW_PROCESSES
            for clock, label in CLOCKS.items()
        ),
        *(
            Metric(f"{RAW_LIMIT}-{c}", "drain-raw", f"raw limit, {label}")
            for c, label in CLOCKS.items()
        ),
    ),
    drain_raw,
    finish=finish_raw,
)
ASYNC_1P = drain_scenario("drain-leaseq", TASK, 1, "async")
SYNC_1P = drain_scenario("drain-leaseq-sync", SYNC_TASK, 1, "sync")
ASYNC_2P = drain_scenario("drain-leaseq-2p", TASK, 2, "async")
SYNC_2P = drain_scenario("drain-leaseq-sync-2p", SYNC_TASK, 2, "sync")
# Claims sized by the round trip (issue 35), opt-in: its ratio to drain-leaseq-2p.
ADAPTIVE_2P = drain_scenario(
    "drain-leaseq-adaptive-2p", TASK, 2, "async adaptive-batch", ("--adaptive-batch",)
)


def _ratios() -> list[Ratio]:
    out: list[Ratio] = []
    targets = {
        ("drain-leaseq", "db"): " (target >= 0.5)",
        ("drain-leaseq-2p", "db"): " (target >= 0.65)",
    }
    for name, what in (
        ("drain-leaseq", "async 1p"),
        ("drain-leaseq-2p", "async 2p"),
        ("drain-leaseq-sync", "sync 1p"),
        ("drain-leaseq-sync-2p", "sync 2p"),
    ):
        for clock, label in CLOCKS.items():
            out.append(
                Ratio(
                    f"leaseq {what} / raw limit, {label}{targets.get((name, clock), '')}",
                    f"{name}-{clock}",
                    f"{RAW_LIMIT}-{clock}",
                )
            )
    for p, suffix in ((1, ""), (2, "-2p")):
        for clock, label in CLOCKS.items():
            target = " (target >= 0.8)" if clock == "db" else ""
            out.append(
                Ratio(
                    f"leaseq sync / async, {p}p, {label}{target}",
                    f"drain-leaseq-sync{suffix}-{clock}",
                    f"drain-leaseq{suffix}-{clock}",
                )
            )
    out.append(
        Ratio("leaseq async 2p / 1p, start-up excluded", "drain-leaseq-2p-db", "drain-leaseq-db")
    )
    for clock, label in CLOCKS.items():
        out.append(
            Ratio(
                f"leaseq --adaptive-batch / fixed batch, async 2p, {label}",
                f"drain-leaseq-adaptive-2p-{clock}",
                f"drain-leaseq-2p-{clock}",
            )
        )
    return out


RATIOS = tuple(_ratios())
SCENARIOS_1P = (ASYNC_1P, SYNC_1P)
SCENARIOS_2P = (ASYNC_2P, SYNC_2P)
