"""The scale check (``scale-*``, opt-in: ``--only 'scale-*'``): ``leaseq worker --burst``
(async no-op handler) with 1, 2, 4 and 8 processes, and with 2 processes serving 100
queues the jobs are spread over, each drain probed while it runs (``bench.probe``): where
the rate flattens, and why.

Per drain: jobs/s on both clocks; worker CPU and PostgreSQL backend CPU per job (µs)
between the first claim and the last completion (the worker's start-up CPU is a figure of
its own);
how busy the machine's CPUs were (both CPU figures over the drain's start-up-excluded
time x the CPU count); the share of the active backends' 50 ms samples spent waiting on a
heavyweight lock (``Lock:*``), on a lightweight lock (``LWLock:*``, e.g. ``WALWrite``) or
on I/O (``IO:*``, e.g. ``WALSync``); WAL bytes and records per job; statements per job
(``pg_stat_statements``; left out if the server does not preload it). The top wait events
of each drain go to the notes and the JSON file.
"""

from __future__ import annotations

import resource
import subprocess
import time
from collections.abc import Sequence
from typing import Any

import psutil

from bench.db import check_drained, drain_span, fill_queue, fresh_schema
from bench.harness import (
    PROCESS_TIMEOUT,
    WORKER_LINE,
    BenchError,
    Metric,
    Ratio,
    Sample,
    Scenario,
    Settings,
    leaseq_root,
    worker_command,
    worker_env,
)
from bench.probe import Probe, ProbeResult, summary

QUEUES_100 = tuple(f"q{i:03d}" for i in range(100))
DETAILS: dict[str, list[dict[str, Any]]] = {}  # scenario -> per round: bench.probe.summary


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def probed_drain(
    settings: Settings, name: str, processes: int, queues: Sequence[str]
) -> dict[str, Sample]:
    with fresh_schema(settings.dsn, name) as client:
        fill_queue(settings.dsn, client, settings.jobs, queues=queues)
        options: list[str] = ["--processes", str(processes)] if processes > 1 else []
        if len(queues) > 1:
            options += ["--any-queue", *(x for q in queues for x in ("--queue", q))]
        command = worker_command(
            "--burst",
            "--concurrency",
            str(settings.concurrency),
            "--batch-size",
            str(settings.batch),
            *options,
        )
        probe = Probe(settings.dsn, client.schema)
        cpu_before = children_cpu()
        started = time.perf_counter()
        proc = psutil.Popen(
            command,
            cwd=leaseq_root(),
            env=worker_env(settings.dsn, client.schema),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        probe.start(proc.pid)
        try:
            out, err = proc.communicate(timeout=PROCESS_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise BenchError(f"{name}: the worker took more than {PROCESS_TIMEOUT:g} s") from None
        finally:
            res = probe.stop()
        wall = time.perf_counter() - started
        worker_total = children_cpu() - cpu_before  # the whole tree, start-up included
        if proc.returncode != 0:
            raise BenchError(f"{name}: worker exited with {proc.returncode}: {err[-2000:]}")
        processed = sum(int(m["jobs"]) for m in WORKER_LINE.finditer(out))
        if processed != settings.jobs:
            raise BenchError(f"{name}: workers processed {processed} of {settings.jobs}")
        check_drained(settings.dsn, client.schema, settings.jobs)
        start, end = drain_span(settings.dsn, client.schema)
    DETAILS.setdefault(name, []).append(summary(res))
    return figures(name, settings.jobs, (start, end), wall, worker_total, res)


def figures(
    name: str,
    jobs: int,
    span: tuple[float, float],
    wall: float,
    worker_total: float,
    res: ProbeResult,
) -> dict[str, Sample]:
    db = span[1] - span[0]
    worker_cpu, backend_cpu = res.cpu_between(*span)
    cpus = psutil.cpu_count() or 1

    def value(v: float) -> Sample:
        return Sample(jobs, db, v)

    out = {
        f"{name}-db": Sample(jobs, db),
        f"{name}-wall": Sample(jobs, wall),
        f"{name}-worker-cpu": value(1e6 * worker_cpu / jobs),
        f"{name}-worker-startup": value(max(0.0, worker_total - worker_cpu)),
        f"{name}-pg-cpu": value(1e6 * backend_cpu / jobs),
        f"{name}-all-busy": value(100.0 * (worker_cpu + backend_cpu) / (db * cpus)),
        f"{name}-lock": value(res.share("Lock:")),
        f"{name}-lwlock": value(res.share("LWLock:")),
        f"{name}-io": value(res.share("IO:")),
        f"{name}-wal-bytes": value(res.wal_bytes / jobs),
        f"{name}-wal-records": value(res.wal_records / jobs),
    }
    if res.statements is not None:
        out[f"{name}-statements"] = value(1000.0 * res.statements / jobs)
    return out


def scale_scenario(name: str, processes: int, queues: Sequence[str]) -> Scenario:
    def fn(settings: Settings) -> dict[str, Sample]:
        return probed_drain(settings, name, processes, queues)

    what = f"{processes}p" + (f", {len(queues)} queues" if len(queues) > 1 else "")
    metrics = (
        Metric(f"{name}-db", name, f"{what}, start-up excluded"),
        Metric(f"{name}-wall", name, f"{what}, process wall"),
        Metric(f"{name}-worker-cpu", name, f"{what}, worker CPU (user+sys)", "µs/job"),
        Metric(f"{name}-worker-startup", name, f"{what}, worker CPU outside the drain", "s"),
        Metric(f"{name}-pg-cpu", name, f"{what}, PostgreSQL backends' CPU", "µs/job"),
        Metric(f"{name}-all-busy", name, f"{what}, CPUs busy (worker + backends)", "%"),
        Metric(f"{name}-lock", name, f"{what}, active backends waiting on Lock", "%"),
        Metric(f"{name}-lwlock", name, f"{what}, active backends waiting on LWLock", "%"),
        Metric(f"{name}-io", name, f"{what}, active backends waiting on IO", "%"),
        Metric(f"{name}-wal-bytes", name, f"{what}, WAL", "bytes/job"),
        Metric(f"{name}-wal-records", name, f"{what}, WAL records", "records/job"),
        Metric(f"{name}-statements", name, f"{what}, statements", "per 1000 jobs"),
    )
    return Scenario(
        name,
        f"scale check: `leaseq worker --burst`, {what}, probed (CPU, waits, WAL, statements)",
        metrics,
        fn,
    )


SCENARIOS = (
    *(scale_scenario(f"scale-{p}p", p, ("default",)) for p in (1, 2, 4, 8)),
    scale_scenario("scale-100q", 2, QUEUES_100),
)

RATIOS = (
    Ratio("scale: 2 / 1 processes, start-up excluded", "scale-2p-db", "scale-1p-db"),
    Ratio("scale: 4 / 2 processes, start-up excluded", "scale-4p-db", "scale-2p-db"),
    Ratio("scale: 8 / 4 processes, start-up excluded", "scale-8p-db", "scale-4p-db"),
    Ratio("scale: 100 queues / 1 queue, 2p, start-up excluded", "scale-100q-db", "scale-2p-db"),
)


def notes() -> list[str]:
    """The top wait events of each probed drain (share of active backend samples)."""
    lines = []
    for name, rounds in DETAILS.items():
        waits = "; ".join(", ".join(f"{k} {v:.0f}%" for k, v in r["waits"].items()) for r in rounds)
        lines.append(f"{name} waits per round (share of active backend samples): {waits}")
    return lines
