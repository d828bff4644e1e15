"""Realistic workloads (issue 35), each against the bound or the baseline it has:

- ``workload-io``: an async handler awaiting 10 ms of I/O (``io_wait``, ``asyncio.sleep``)
  at concurrency 1,000 per process, 1 and 2 processes. Its bound is concurrency / latency
  (100,000 jobs/s per process); the report gives the share of it reached, the worker's CPU
  per job, and the ratio to the no-op drain of the same round (``drain-leaseq``, ``-2p``).
  A ratio near 1 says the handler's wait is not what bounds it: the worker's CPU per job
  (one core per process, shared with the server) is.
- ``workload-payload``: 1 KB and 100 KB payloads (incompressible text), leaseq at 2
  processes against the minimal table at 2 processes, batch 100, whose claim then returns
  the payload too (a worker needs it). 100 KB drains take N/20 jobs (N x 100 KB would not
  fit the server's memory at the default N).
- ``workload-queues``: N jobs spread over 100 queues, one worker serving all of them at 2
  processes, against the minimal drain cycling through the same 100 queues (2 processes,
  batch 100), and against the one-queue drains of the same round.

The 1,000,000-job backlog is ``workload-backlog`` (bench/scenarios/backlog.py). Every drain
is timed on the two clocks of bench/scenarios/drain.py; each leaseq drain also reports its
worker processes' CPU (user + sys, start-up included) per job.
"""

from __future__ import annotations

import resource
from collections.abc import Sequence

from bench.apps import IO_SECONDS
from bench.db import check_drained, drain_clock, fill_queue, fresh_schema
from bench.harness import (
    QUEUE,
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
from bench.minimal import queue_names
from bench.scenarios.drain import CLOCKS
from bench.scenarios.minimal import key as minimal_key
from bench.scenarios.minimal import minimal_drain

IO_TASK = "io_wait"
IO_CONCURRENCY = 1000  # per process
IO_PROCESSES = (1, 2)
PAYLOADS = (1024, 100 * 1024)  # bytes of padding per payload
BIG_PAYLOAD_SHARE = 20  # a 100 KB drain takes N / 20 jobs
QUEUES = 100
PROCESSES = 2  # payload and queue drains, both systems
MINIMAL_BATCH = 100


def children_cpu() -> float:
    """User + sys seconds of every reaped child process so far (and theirs)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def leaseq_run(
    settings: Settings,
    name: str,
    jobs: int,
    *,
    task: str = TASK,
    processes: int = PROCESSES,
    queues: Sequence[str] = (QUEUE,),
    pad: int = 0,
    options: Sequence[str] = (),
) -> dict[str, Sample]:
    """``leaseq worker --burst`` on ``jobs`` pending jobs (filled untimed): samples
    ``{name}-db``, ``{name}-wall`` and ``{name}-cpu`` (worker CPU, microseconds per job)."""
    with fresh_schema(settings.dsn, name) as client:
        fill_queue(settings.dsn, client, jobs, task=task, queues=queues, pad=pad)
        extra = list(options)
        if processes > 1:
            extra += ["--processes", str(processes)]
        if list(queues) != [QUEUE]:
            extra += ["--any-queue", *(w for q in queues for w in ("--queue", q))]
        before = children_cpu()
        wall, lines = run_burst_worker(settings, client.schema, *extra, cwd=leaseq_root())
        cpu = children_cpu() - before
        processed = sum(int(m["jobs"]) for m in lines)
        succeeded = sum(int(m["succeeded"]) for m in lines)
        if len(lines) != processes or processed != jobs or succeeded != jobs:
            raise BenchError(
                f"{name}: {processes} worker process(es) processed {processed} of {jobs}"
            )
        check_drained(settings.dsn, client.schema, jobs)
        db = drain_clock(settings.dsn, client.schema)
    return {
        f"{name}-db": Sample(jobs, db),
        f"{name}-wall": Sample(jobs, wall),
        f"{name}-cpu": Sample(jobs, cpu, cpu / jobs * 1e6),
    }


def clock_metrics(key: str, scenario: str, what: str, cpu: bool = True) -> tuple[Metric, ...]:
    out = tuple(Metric(f"{key}-{c}", scenario, f"{what}, {label}") for c, label in CLOCKS.items())
    if cpu:
        out += (Metric(f"{key}-cpu", scenario, f"{what}, worker CPU per job", "us"),)
    return out


# -- I/O-bound handler ------------------------------------------------------------------

IO = "workload-io"


def io_key(processes: int) -> str:
    return f"wl-io-{processes}p"


def io_bound(processes: int) -> float:
    """The concurrency/latency bound: jobs/s if every slot always waited on its I/O."""
    return processes * IO_CONCURRENCY / IO_SECONDS


def workload_io(settings: Settings) -> dict[str, Sample]:
    out: dict[str, Sample] = {}
    for processes in IO_PROCESSES:
        name = io_key(processes)
        samples = leaseq_run(
            settings,
            name,
            settings.jobs,
            task=IO_TASK,
            processes=processes,
            options=("--concurrency", str(IO_CONCURRENCY)),  # the last one given counts
        )
        db = samples[f"{name}-db"]
        samples[f"{name}-bound"] = Sample(db.jobs, db.seconds, 100 * db.rate / io_bound(processes))
        out.update(samples)
    return out


IO_SCENARIO = Scenario(
    IO,
    f"async handler awaiting {IO_SECONDS * 1000:g} ms, concurrency {IO_CONCURRENCY} per "
    f"process, {'/'.join(map(str, IO_PROCESSES))} processes, against concurrency/latency",
    tuple(
        m
        for p in IO_PROCESSES
        for m in (
            *clock_metrics(io_key(p), IO, f"leaseq I/O-bound handler, {p}p"),
            Metric(
                f"{io_key(p)}-bound",
                IO,
                f"leaseq I/O-bound, {p}p, share of the bound {io_bound(p):,.0f}/s "
                "(start-up excluded; target >= 90)",
                "%",
            ),
        )
    ),
    workload_io,
)

IO_RATIOS = tuple(
    Ratio(
        f"I/O-bound handler / no-op handler, {p}p, start-up excluded (near 1: CPU-bound)",
        f"{io_key(p)}-db",
        f"drain-leaseq{'' if p == 1 else f'-{p}p'}-db",
    )
    for p in IO_PROCESSES
)


# -- payloads ---------------------------------------------------------------------------

PAYLOAD = "workload-payload"


def payload_jobs(settings: Settings, pad: int) -> int:
    return settings.jobs if pad < PAYLOADS[-1] else max(1, settings.jobs // BIG_PAYLOAD_SHARE)


def payload_key(system: str, pad: int) -> str:
    return f"wl-payload-{pad // 1024}kb-{system}"


def workload_payload(settings: Settings) -> dict[str, Sample]:
    out: dict[str, Sample] = {}
    for pad in PAYLOADS:
        jobs = payload_jobs(settings, pad)
        out.update(leaseq_run(settings, payload_key("leaseq", pad), jobs, pad=pad))
        db, wall = minimal_drain(settings, jobs, PROCESSES, MINIMAL_BATCH, pad=pad, payload=True)
        out[f"{payload_key('minimal', pad)}-db"] = db
        out[f"{payload_key('minimal', pad)}-wall"] = wall
    return out


def _kb(pad: int) -> str:
    return f"{pad // 1024} KB"


PAYLOAD_SCENARIO = Scenario(
    PAYLOAD,
    f"{' and '.join(map(_kb, PAYLOADS))} payloads: leaseq {PROCESSES}p against the minimal "
    f"table {PROCESSES}p batch {MINIMAL_BATCH} (its claim returning the payload)",
    tuple(
        m
        for pad in PAYLOADS
        for m in (
            *clock_metrics(payload_key("leaseq", pad), PAYLOAD, f"leaseq {PROCESSES}p, {_kb(pad)}"),
            *clock_metrics(
                payload_key("minimal", pad),
                PAYLOAD,
                f"minimal {PROCESSES}p batch {MINIMAL_BATCH}, {_kb(pad)}",
                cpu=False,
            ),
        )
    ),
    workload_payload,
)

PAYLOAD_RATIOS = (
    *(
        Ratio(
            f"leaseq / minimal, {_kb(pad)} payloads, {label}",
            f"{payload_key('leaseq', pad)}-{clock}",
            f"{payload_key('minimal', pad)}-{clock}",
        )
        for pad in PAYLOADS
        for clock, label in CLOCKS.items()
    ),
    *(
        Ratio(
            f"leaseq {_kb(pad)} payloads / no-op payload, {PROCESSES}p, start-up excluded",
            f"{payload_key('leaseq', pad)}-db",
            "drain-leaseq-2p-db",
        )
        for pad in PAYLOADS
    ),
)


# -- many queues ------------------------------------------------------------------------

MANY = "workload-queues"
MANY_LEASEQ = f"wl-queues-{QUEUES}-leaseq"
MANY_MINIMAL = f"wl-queues-{QUEUES}-minimal"


def workload_queues(settings: Settings) -> dict[str, Sample]:
    out = leaseq_run(settings, MANY_LEASEQ, settings.jobs, queues=queue_names(QUEUES))
    db, wall = minimal_drain(settings, settings.jobs, PROCESSES, MINIMAL_BATCH, queues=QUEUES)
    out[f"{MANY_MINIMAL}-db"], out[f"{MANY_MINIMAL}-wall"] = db, wall
    return out


MANY_SCENARIO = Scenario(
    MANY,
    f"N jobs over {QUEUES} queues: one leaseq worker serving them all ({PROCESSES}p) against "
    f"the minimal drain cycling through them ({PROCESSES}p, batch {MINIMAL_BATCH})",
    (
        *clock_metrics(MANY_LEASEQ, MANY, f"leaseq {PROCESSES}p, {QUEUES} queues"),
        *clock_metrics(
            MANY_MINIMAL,
            MANY,
            f"minimal {PROCESSES}p batch {MINIMAL_BATCH}, {QUEUES} queues",
            False,
        ),
    ),
    workload_queues,
)

MANY_RATIOS = (
    *(
        Ratio(
            f"leaseq / minimal, {QUEUES} queues, {label}",
            f"{MANY_LEASEQ}-{clock}",
            f"{MANY_MINIMAL}-{clock}",
        )
        for clock, label in CLOCKS.items()
    ),
    Ratio(
        f"leaseq {QUEUES} queues / 1 queue, {PROCESSES}p, start-up excluded",
        f"{MANY_LEASEQ}-db",
        "drain-leaseq-2p-db",
    ),
    Ratio(
        f"minimal {QUEUES} queues / 1 queue, {PROCESSES}p batch {MINIMAL_BATCH}, start-up excluded",
        f"{MANY_MINIMAL}-db",
        minimal_key(PROCESSES, MINIMAL_BATCH, "db"),
    ),
)

SCENARIOS = (IO_SCENARIO, PAYLOAD_SCENARIO, MANY_SCENARIO)
RATIOS = (*IO_RATIOS, *PAYLOAD_RATIOS, *MANY_RATIOS)
