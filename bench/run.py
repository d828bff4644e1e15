"""Side-by-side benchmark: leaseq against the raw-SQL limit, all in one run.

Every scenario runs ``--repeat`` times; the repeats are interleaved (round 1 of every
scenario, then round 2, ...) so that drift of the machine hits all scenarios alike. Each
sample gets a fresh schema, made with ``leaseq.Client(dsn, schema=...).migrate()`` and
dropped afterwards. Most figures are rates (jobs, claims or leases per second); some are
latencies (ms) or durations (s). Each is printed as the median and min-max over the
repeats. Ratios pair the samples of the same round and report the median and min-max of
those per-round ratios.

This prints figures and asserts nothing about time. It does check that each scenario
really did its work (every job drained, every lease swept, every old row pruned), since a
figure for work that was not done would be meaningless.

Usage: ``python -m bench [--dsn DSN] [--jobs N] [--batch B] [--repeat R] [--only NAME]``;
see bench/README.md.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import fnmatch
import json
import os
import pathlib
import platform
import re
import secrets
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import sql

import leaseq
from leaseq.dsn import describe_dsn
from leaseq.sql import Queries

REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent
DEFAULT_OUT = pathlib.Path(__file__).resolve().parent / "results" / "latest.json"
WORKER_APP = "bench.apps:app"
TASK = "noop"  # the task bench/apps.py registers
QUEUE = "default"
ENQUEUE_CHUNK = 1000  # the chunk size of the "chunks" enqueue figures
PREP_CHUNK = 5000  # untimed enqueue_many chunks that fill the queue before a drain

# "processed 10000 job(s) in 0.60s (16554/s): 10000 succeeded, 0 failed, 0 lost lease(s)"
WORKER_LINE = re.compile(
    r"processed (?P<jobs>\d+) job\(s\) in (?P<seconds>[0-9.]+)s \((?P<rate>[0-9.]+)/s\)"
    r": (?P<succeeded>\d+) succeeded, (?P<failed>\d+) failed, (?P<lost>\d+) lost"
)


class BenchError(Exception):
    """A scenario could not produce a trustworthy figure."""


class ScenarioUnavailable(Exception):
    """Raised by a scenario that cannot run here (e.g. a peer queue is not installed)."""


# -- settings and results ---------------------------------------------------------------


@dataclass(frozen=True)
class Settings:
    dsn: str
    jobs: int
    batch: int
    concurrency: int
    single: int
    repeat: int


@dataclass(frozen=True)
class Sample:
    jobs: int
    seconds: float

    @property
    def rate(self) -> float:
        return self.jobs / self.seconds if self.seconds > 0 else float("inf")


@dataclass(frozen=True)
class Metric:
    """One figure a scenario reports, e.g. the worker's wall time or its own timer."""

    key: str  # unique over all scenarios; ratios refer to it
    scenario: str
    label: str


@dataclass
class Series:
    metric: Metric
    samples: list[Sample] = field(default_factory=list)

    def rates(self) -> list[float]:
        return [s.rate for s in self.samples]


@dataclass(frozen=True)
class Ratio:
    label: str
    numerator: str  # Metric.key
    denominator: str  # Metric.key


ScenarioFn = Callable[[Settings], dict[str, Sample]]


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    metrics: tuple[Metric, ...]
    fn: ScenarioFn


# -- database helpers -------------------------------------------------------------------


def connect(dsn: str) -> psycopg.Connection[Any]:
    return psycopg.connect(dsn, autocommit=True, application_name="leaseq-bench")


def new_schema_name(scenario: str) -> str:
    return f"bench_{scenario.replace('-', '_')}_{secrets.token_hex(4)}"


@contextlib.contextmanager
def fresh_schema(settings: Settings, scenario: str) -> Iterator[leaseq.Client]:
    """A newly migrated schema and a sync client on it; the schema is dropped afterwards."""
    schema = new_schema_name(scenario)
    client = leaseq.Client(settings.dsn, schema=schema)
    try:
        client.migrate()  # also opens the client's pool, so no sample pays for connecting
        yield client
    finally:
        client.close()
        with connect(settings.dsn) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


def jobs_table(schema: str) -> sql.Composed:
    return sql.SQL("{}.jobs").format(sql.Identifier(schema))


def fill_queue(settings: Settings, client: leaseq.Client) -> None:
    """Untimed: N pending no-op jobs, then VACUUM ANALYZE so every drain starts alike."""
    for start in range(0, settings.jobs, PREP_CHUNK):
        count = min(PREP_CHUNK, settings.jobs - start)
        client.enqueue_many(
            leaseq.JobSpec(TASK, {"n": start + i}, queue=QUEUE) for i in range(count)
        )
    with connect(settings.dsn) as conn:
        conn.execute(sql.SQL("VACUUM (ANALYZE) {}").format(jobs_table(client.schema)))


def check_drained(settings: Settings, schema: str) -> None:
    with connect(settings.dsn) as conn:
        row = conn.execute(
            sql.SQL("SELECT count(*) FILTER (WHERE status = 'succeeded'), count(*) FROM {}").format(
                jobs_table(schema)
            )
        ).fetchone()
    assert row is not None
    succeeded, total = int(row[0]), int(row[1])
    if succeeded != settings.jobs or total != settings.jobs:
        raise BenchError(
            f"drain left work undone: {succeeded} of {total} jobs succeeded, "
            f"{settings.jobs} were enqueued"
        )


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


def leaseq_root() -> pathlib.Path:
    """The directory holding the leaseq package this process imported."""
    return pathlib.Path(leaseq.__file__).resolve().parent.parent


def worker_pythonpath(existing: str) -> str:
    """The worker imports the same leaseq as this process, and bench.apps from this repo."""
    entries = [str(leaseq_root()), str(REPO_ROOT), *existing.split(os.pathsep)]
    unique = [e for i, e in enumerate(entries) if e and e not in entries[:i]]
    return os.pathsep.join(unique)


# -- scenarios --------------------------------------------------------------------------


def drain_raw(settings: Settings) -> dict[str, Sample]:
    """One autocommit connection, leaseq's own claim_jobs and complete_jobs texts, no
    asyncio, no pool, no Lease objects: the floor under any worker built on these
    statements."""
    with fresh_schema(settings, "drain-raw") as client:
        fill_queue(settings, client)
        queries = Queries(client.schema)
        claim, complete = queries["claim_jobs"], queries["complete_jobs"]
        params = {
            "queue": QUEUE,
            "owner": f"bench-raw:{os.getpid()}",
            "lease_seconds": 60.0,
            "limit": settings.batch,
        }
        done = 0
        with connect(settings.dsn) as conn:
            started = time.perf_counter()
            while True:
                rows = conn.execute(claim, params).fetchall()
                if not rows:
                    break
                fence = {
                    "ids": [row[0] for row in rows],
                    "tokens": [row[1] for row in rows],
                    "owners": [row[2] for row in rows],
                }
                done += len(conn.execute(complete, fence).fetchall())
            elapsed = time.perf_counter() - started
        check_drained(settings, client.schema)
    return {"drain-raw": Sample(done, elapsed)}


def drain_leaseq(settings: Settings) -> dict[str, Sample]:
    """A real ``leaseq worker --burst`` subprocess; wall time and the worker's own figure."""
    with fresh_schema(settings, "drain-leaseq") as client:
        fill_queue(settings, client)
        env = dict(os.environ)
        env["LEASEQ_DSN"] = settings.dsn  # by env, not argv: keeps a password out of `ps`
        env["LEASEQ_SCHEMA"] = client.schema
        env["PYTHONPATH"] = worker_pythonpath(env.get("PYTHONPATH", ""))
        command = [
            sys.executable,
            "-P",  # no cwd on sys.path: leaseq comes from worker_pythonpath()
            "-m",
            "leaseq",
            "worker",
            WORKER_APP,
            "--burst",
            "--concurrency",
            str(settings.concurrency),
            "--batch-size",
            str(settings.batch),
        ]
        started = time.perf_counter()
        proc = subprocess.run(
            command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, check=False
        )
        wall = time.perf_counter() - started
        if proc.returncode != 0:
            raise BenchError(f"worker exited with {proc.returncode}: {proc.stderr.strip()[-2000:]}")
        match = WORKER_LINE.search(proc.stdout)
        if match is None:
            raise BenchError(f"no 'processed ...' line in the worker's output: {proc.stdout!r}")
        processed = int(match["jobs"])
        if processed != settings.jobs or int(match["succeeded"]) != settings.jobs:
            raise BenchError(f"worker processed {processed} of {settings.jobs}: {match[0]}")
        # The printed rate has more significant digits than the printed seconds.
        own_seconds = processed / float(match["rate"])
        check_drained(settings, client.schema)
    return {
        "drain-leaseq-own": Sample(processed, own_seconds),
        "drain-leaseq-wall": Sample(processed, wall),
    }


def enqueue_single_raw(settings: Settings) -> dict[str, Sample]:
    """M single-row inserts on one autocommit connection, each its own transaction."""
    with fresh_schema(settings, "enqueue-single-raw") as client:
        insert = sql.SQL(
            "INSERT INTO {} (queue_name, task, payload) VALUES (%s, %s, %s::jsonb) RETURNING id"
        ).format(jobs_table(client.schema))
        with connect(settings.dsn) as conn:
            started = time.perf_counter()
            for i in range(settings.single):
                conn.execute(insert, (QUEUE, TASK, json.dumps({"n": i}))).fetchone()
            elapsed = time.perf_counter() - started
    return {"enqueue-single-raw": Sample(settings.single, elapsed)}


def enqueue_single(settings: Settings) -> dict[str, Sample]:
    """M ``Client.enqueue`` calls (sync client), each its own transaction."""
    with fresh_schema(settings, "enqueue-single") as client:
        started = time.perf_counter()
        for i in range(settings.single):
            client.enqueue(TASK, {"n": i}, queue=QUEUE)
        elapsed = time.perf_counter() - started
    return {"enqueue-single": Sample(settings.single, elapsed)}


def _chunks(n: int, size: int) -> list[range]:
    return [range(start, min(start + size, n)) for start in range(0, n, size)]


def enqueue_bulk_raw(settings: Settings) -> dict[str, Sample]:
    """Plain ``INSERT ... SELECT FROM unnest(jsonb[]) RETURNING id``: chunks of 1000, and
    all N in one statement (each in its own fresh schema)."""
    out: dict[str, Sample] = {}
    for key, size in (
        ("enqueue-bulk-raw-chunks", ENQUEUE_CHUNK),
        ("enqueue-bulk-raw-all", settings.jobs),
    ):
        with fresh_schema(settings, "enqueue-bulk-raw") as client:
            insert = sql.SQL(
                "INSERT INTO {} (queue_name, task, payload) "
                "SELECT %s, %s, p FROM unnest(%s::jsonb[]) AS u(p) RETURNING id"
            ).format(jobs_table(client.schema))
            chunks = _chunks(settings.jobs, size)
            with connect(settings.dsn) as conn:
                started = time.perf_counter()
                for chunk in chunks:
                    payloads = [json.dumps({"n": i}) for i in chunk]
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
        with fresh_schema(settings, "enqueue-bulk") as client:
            batches = [
                [leaseq.JobSpec(TASK, {"n": i}, queue=QUEUE) for i in chunk]
                for chunk in _chunks(settings.jobs, size)
            ]
            started = time.perf_counter()
            for batch in batches:
                client.enqueue_many(batch)
            elapsed = time.perf_counter() - started
        out[key] = Sample(settings.jobs, elapsed)
    return out


def _m(key: str, scenario: str, label: str) -> Metric:
    return Metric(key, scenario, label)


SCENARIOS: tuple[Scenario, ...] = (
    Scenario(
        "drain-raw",
        "raw-SQL drain limit: claim_jobs + complete_jobs in a loop on one connection",
        (_m("drain-raw", "drain-raw", "claim_jobs+complete_jobs loop, 1 conn"),),
        drain_raw,
    ),
    Scenario(
        "drain-leaseq",
        "`leaseq worker --burst` subprocess draining the same N no-op jobs",
        (
            _m("drain-leaseq-wall", "drain-leaseq", "worker, wall (startup included)"),
            _m("drain-leaseq-own", "drain-leaseq", "worker, its own figure (startup excluded)"),
        ),
        drain_leaseq,
    ),
    Scenario(
        "enqueue-single-raw",
        "M single-row INSERT ... RETURNING id, autocommit, one connection",
        (_m("enqueue-single-raw", "enqueue-single-raw", "INSERT ... RETURNING id, 1 conn"),),
        enqueue_single_raw,
    ),
    Scenario(
        "enqueue-single",
        "M Client.enqueue calls (sync client)",
        (_m("enqueue-single", "enqueue-single", "Client.enqueue"),),
        enqueue_single,
    ),
    Scenario(
        "enqueue-bulk-raw",
        "N rows by INSERT ... SELECT unnest(jsonb[]): chunks of 1000, and all at once",
        (
            _m(
                "enqueue-bulk-raw-chunks",
                "enqueue-bulk-raw",
                f"unnest insert, {ENQUEUE_CHUNK}/stmt",
            ),
            _m("enqueue-bulk-raw-all", "enqueue-bulk-raw", "unnest insert, N in 1 stmt"),
        ),
        enqueue_bulk_raw,
    ),
    Scenario(
        "enqueue-bulk",
        "N jobs by Client.enqueue_many: chunks of 1000, and all at once",
        (
            _m("enqueue-bulk-chunks", "enqueue-bulk", f"enqueue_many, {ENQUEUE_CHUNK}/call"),
            _m("enqueue-bulk-all", "enqueue-bulk", "enqueue_many, N in 1 call"),
        ),
        enqueue_bulk,
    ),
)

RATIOS: tuple[Ratio, ...] = (
    Ratio("leaseq drain / raw drain (worker's own figure)", "drain-leaseq-own", "drain-raw"),
    Ratio("leaseq drain / raw drain (wall, startup included)", "drain-leaseq-wall", "drain-raw"),
    Ratio("leaseq single enqueue / raw insert", "enqueue-single", "enqueue-single-raw"),
    Ratio(
        f"leaseq bulk enqueue / raw bulk insert ({ENQUEUE_CHUNK}/stmt)",
        "enqueue-bulk-chunks",
        "enqueue-bulk-raw-chunks",
    ),
    Ratio(
        "leaseq bulk enqueue / raw bulk insert (N in 1)", "enqueue-bulk-all", "enqueue-bulk-raw-all"
    ),
)


# -- running and reporting --------------------------------------------------------------


def select_scenarios(patterns: Sequence[str]) -> list[Scenario]:
    if not patterns:
        return list(SCENARIOS)
    wanted = [p.strip() for item in patterns for p in item.split(",") if p.strip()]
    chosen: list[Scenario] = []
    for pattern in wanted:
        hits = [s for s in SCENARIOS if fnmatch.fnmatchcase(s.name, pattern)]
        if not hits:
            names = ", ".join(s.name for s in SCENARIOS)
            raise SystemExit(f"bench: error: no scenario matches {pattern!r} (have: {names})")
        chosen.extend(s for s in hits if s not in chosen)
    # Keep the canonical order: a raw scenario runs right before its leaseq twin.
    return [s for s in SCENARIOS if s in chosen]


def spread(values: Sequence[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def round_ratios(series: dict[str, Series], ratio: Ratio) -> list[float] | None:
    num, den = series.get(ratio.numerator), series.get(ratio.denominator)
    if num is None or den is None or not num.samples or not den.samples:
        return None
    return [a / b for a, b in zip(num.rates(), den.rates(), strict=False)]


def _fmt_rate(value: float) -> str:
    return f"{value:,.0f}"


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], right: set[int]) -> str:
    widths = [max(len(r[i]) for r in [headers, *rows]) for i in range(len(headers))]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(headers), rule, *(line(r) for r in rows)])


def render(series: dict[str, Series], settings: Settings, info: dict[str, Any]) -> str:
    rows: list[list[str]] = []
    for s in series.values():
        if not s.samples:
            continue
        st = spread(s.rates())
        jobs = s.samples[0].jobs
        rows.append(
            [
                s.metric.scenario,
                s.metric.label,
                f"{jobs:,}",
                _fmt_rate(st["median"]),
                f"{_fmt_rate(st['min'])}-{_fmt_rate(st['max'])}",
            ]
        )
    headers = ["scenario", "what", "jobs", "jobs/s median", "min-max"]
    out = [
        f"leaseq bench: {describe_dsn(settings.dsn)}, PostgreSQL {info['server_version']} "
        f"(fsync={info['fsync']}, synchronous_commit={info['synchronous_commit']}), "
        f"{os.cpu_count()} CPUs",
        *([] if leaseq_root() == REPO_ROOT else [f"leaseq imported from {leaseq_root()}"]),
        f"jobs={settings.jobs:,} batch={settings.batch} concurrency={settings.concurrency} "
        f"single={settings.single:,} repeat={settings.repeat}",
        "",
        _table(headers, rows, right={2, 3, 4}),
    ]
    ratio_rows: list[list[str]] = []
    for ratio in RATIOS:
        values = round_ratios(series, ratio)
        if values:
            st = spread(values)
            ratio_rows.append(
                [ratio.label, f"{st['median']:.2f}", f"{st['min']:.2f}-{st['max']:.2f}"]
            )
    if ratio_rows:
        out += ["", _table(["ratio (per round)", "median", "min-max"], ratio_rows, right={1, 2})]
    return "\n".join(out)


def git_revision() -> str | None:
    """HEAD of this repo, with "+dirty" when leaseq/ or bench/ has uncommitted changes."""
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "leaseq", "bench"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return rev + ("+dirty" if dirty else "")


def results_json(
    series: dict[str, Series], settings: Settings, info: dict[str, Any]
) -> dict[str, Any]:
    metrics = []
    for s in series.values():
        if s.samples:
            metrics.append(
                {
                    "key": s.metric.key,
                    "scenario": s.metric.scenario,
                    "label": s.metric.label,
                    "jobs": s.samples[0].jobs,
                    "jobs_per_s": spread(s.rates()),
                    "samples": [
                        {"jobs": x.jobs, "seconds": x.seconds, "jobs_per_s": x.rate}
                        for x in s.samples
                    ],
                }
            )
    ratios = []
    for ratio in RATIOS:
        values = round_ratios(series, ratio)
        if values:
            ratios.append(
                {
                    "label": ratio.label,
                    "numerator": ratio.numerator,
                    "denominator": ratio.denominator,
                    "per_round": values,
                    **spread(values),
                }
            )
    return {
        "when": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "leaseq_version": leaseq.__version__,
        "leaseq_path": str(leaseq_root()),
        "git": git_revision(),
        "leaseq_from_repo": leaseq_root() == REPO_ROOT,
        "python": platform.python_version(),
        "psycopg": psycopg.__version__,
        "cpus": os.cpu_count(),
        "database": describe_dsn(settings.dsn),
        "server": info,
        "settings": {
            "jobs": settings.jobs,
            "batch": settings.batch,
            "concurrency": settings.concurrency,
            "single": settings.single,
            "repeat": settings.repeat,
        },
        "metrics": metrics,
        "ratios": ratios,
    }


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    names = ", ".join(s.name for s in SCENARIOS)
    p = argparse.ArgumentParser(
        prog="python -m bench",
        description="leaseq against the raw-SQL limit, measured in one run. "
        "Prints jobs/s (median and min-max over the repeats) and ratios.",
    )
    p.add_argument(
        "--dsn",
        default=None,
        help="PostgreSQL DSN (default: env LEASEQ_DSN, else leaseq's embedded server)",
    )
    p.add_argument("--jobs", "-n", type=int, default=20000, help="jobs per drain / bulk enqueue")
    p.add_argument("--batch", "-b", type=int, default=100, help="claim batch size")
    p.add_argument(
        "--concurrency",
        "-c",
        type=int,
        default=None,
        help="worker concurrency (default: 2 x --batch, so claims overlap completions)",
    )
    p.add_argument("--single", "-m", type=int, default=5000, help="single-row enqueues per sample")
    p.add_argument("--repeat", "-r", type=int, default=3, help="samples per scenario")
    p.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="NAME",
        help=f"run only these scenarios (repeatable, comma-separated, globs ok): {names}",
    )
    p.add_argument(
        "--out",
        type=pathlib.Path,
        default=DEFAULT_OUT,
        help="JSON results file (default: bench/results/latest.json)",
    )
    p.add_argument("--list", action="store_true", help="list the scenarios and exit")
    args = p.parse_args(argv)
    for name in ("jobs", "batch", "single", "repeat"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be at least 1")
    if args.concurrency is not None and args.concurrency < 1:
        p.error("--concurrency must be at least 1")
    return args


def resolve_bench_dsn(explicit: str | None) -> str:
    if explicit:
        return explicit
    from_env = os.environ.get("LEASEQ_DSN", "").strip()
    if from_env:
        return from_env
    from leaseq.embedded import embedded_dsn

    return embedded_dsn()


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.list:
        for s in SCENARIOS:
            print(f"{s.name:20}  {s.description}")
        return 0
    scenarios = select_scenarios(args.only)
    settings = Settings(
        dsn=resolve_bench_dsn(args.dsn),
        jobs=args.jobs,
        batch=args.batch,
        concurrency=args.concurrency or 2 * args.batch,
        single=args.single,
        repeat=args.repeat,
    )
    info = server_info(settings.dsn)
    series = {m.key: Series(m) for s in scenarios for m in s.metrics}
    unavailable: set[str] = set()
    try:
        for round_no in range(1, settings.repeat + 1):
            for scenario in scenarios:
                if scenario.name in unavailable:
                    continue
                try:
                    samples = scenario.fn(settings)
                except ScenarioUnavailable as exc:
                    unavailable.add(scenario.name)
                    print(f"{scenario.name}: skipped: {exc}", file=sys.stderr, flush=True)
                    continue
                parts = []
                for key, sample in samples.items():
                    series[key].samples.append(sample)
                    parts.append(f"{key} {_fmt_rate(sample.rate)}/s ({sample.seconds:.2f}s)")
                print(
                    f"[{round_no}/{settings.repeat}] {scenario.name}: " + ", ".join(parts),
                    file=sys.stderr,
                    flush=True,
                )
    except KeyboardInterrupt:
        print("bench: interrupted", file=sys.stderr)
        return 130
    except BenchError as exc:
        print(f"bench: error: {exc}", file=sys.stderr)
        return 1
    print(render(series, settings, info))
    out: pathlib.Path = args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results_json(series, settings, info), indent=2) + "\n")
    print(f"\nresults: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
