"""The benchmark harness: settings, samples and metrics, worker subprocesses, timing
helpers, the interleaved rounds and the per-round ratios.

Everything a scenario module or an entry point shares lives here (or in ``bench.db`` for
the database, ``bench.report`` for output). It knows no scenario by name: the scenario
list is ``bench.catalog``.
"""

from __future__ import annotations

import fnmatch
import importlib.metadata
import importlib.util
import os
import pathlib
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import leaseq

REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent
DEFAULT_OUT = pathlib.Path(__file__).resolve().parent / "results" / "latest.json"
WORKER_APP = "bench.apps:app"
TASK = "noop"  # the no-op task bench/apps.py registers
SYNC_TASK = "noop_sync"  # the same as a sync handler (run on the worker's threads)
STAMP_TASK = "stamp"  # the task that records its start time (wake-latency)
QUEUE = "default"
DEFAULT_BACKLOGS = (10_000, 100_000, 1_000_000)
DEFAULT_PEER_JOBS = 2000  # procrastinate's N: it drains ~0.1-0.3k jobs/s on 2 cores
BENCH_EXTRA = "pip install -e '.[bench]'"
PROCESS_TIMEOUT = 600.0  # longest a drain subprocess may take

# The worker's human summary line, the only place a --burst worker reports its own figure:
# "processed 10000 job(s) in 0.60s (16554/s): 10000 succeeded, 0 failed, 0 lost lease(s)".
# NOTE: this couples the benchmark to the CLI's wording. It stays until `leaseq worker`
# offers a machine-readable summary (e.g. a JSON line); the CLI is not part of bench/.
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
    prune_old: int = 200_000
    wake_jobs: int = 200
    expired: int = 100_000
    claims: int = 2000
    backlogs: tuple[int, ...] = DEFAULT_BACKLOGS
    peer_jobs: int = DEFAULT_PEER_JOBS  # jobs per drain-procrastinate sample
    results_dir: pathlib.Path = DEFAULT_OUT.parent
    checkpoint: bool = False  # may this role run CHECKPOINT (see bench.db.settle)


@dataclass(frozen=True)
class Sample:
    """One measurement. A rate metric's figure is ``jobs / seconds``; a metric that is not
    a rate (a latency, a duration, a share) sets ``value`` and that is its figure."""

    jobs: int  # the work the figure covers: jobs, claims, leases, latency samples
    seconds: float
    value: float | None = None

    @property
    def rate(self) -> float:
        return self.jobs / self.seconds if self.seconds > 0 else float("inf")

    @property
    def figure(self) -> float:
        return self.rate if self.value is None else self.value


@dataclass(frozen=True)
class Metric:
    """One figure a scenario reports, e.g. the worker's wall time or its own timer."""

    key: str  # unique over all scenarios; ratios refer to it
    scenario: str
    label: str
    unit: str = "jobs/s"  # "<things>/s" for rates; "ms", "s" or "%" for values


@dataclass
class Series:
    metric: Metric
    samples: list[Sample] = field(default_factory=list)

    def figures(self) -> list[float]:
        return [s.figure for s in self.samples]


@dataclass(frozen=True)
class Ratio:
    label: str
    numerator: str  # Metric.key
    denominator: str  # Metric.key
    inverse: bool = False  # report denominator/numerator (a time ratio from two rates)


ScenarioFn = Callable[[Settings], dict[str, Sample]]


ScenarioFinish = Callable[[dict[str, Series]], None]


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    metrics: tuple[Metric, ...]
    fn: ScenarioFn
    #: Runs when ``python -m bench`` is given no ``--only``; the heavy parts are opt-in.
    default: bool = True
    #: Called once after all the rounds, to fill metrics that need every round (the raw
    #: limit is the best configuration over all of them).
    finish: ScenarioFinish | None = None


# -- worker subprocesses ----------------------------------------------------------------


def leaseq_root() -> pathlib.Path:
    """The directory holding the leaseq package this process imported."""
    return pathlib.Path(leaseq.__file__).resolve().parent.parent


def worker_pythonpath(existing: str) -> str:
    """The worker imports the same leaseq as this process, and bench.apps from this repo."""
    entries = [str(leaseq_root()), str(REPO_ROOT), *existing.split(os.pathsep)]
    unique = [e for i, e in enumerate(entries) if e and e not in entries[:i]]
    return os.pathsep.join(unique)


def worker_env(dsn: str, schema: str) -> dict[str, str]:
    env = dict(os.environ)
    env["LEASEQ_DSN"] = dsn  # by env, not argv: keeps a password out of `ps`
    env["LEASEQ_SCHEMA"] = schema
    env["PYTHONPATH"] = worker_pythonpath(env.get("PYTHONPATH", ""))
    return env


def worker_command(*options: str) -> list[str]:
    return [
        sys.executable,
        "-P",  # no cwd on sys.path: leaseq comes from worker_pythonpath()
        "-m",
        "leaseq",
        "worker",
        WORKER_APP,
        *options,
    ]


def run_burst_worker(
    settings: Settings, schema: str, *options: str, cwd: pathlib.Path = REPO_ROOT
) -> tuple[float, list[re.Match[str]]]:
    """Run ``leaseq worker --burst`` to completion: (wall seconds, its 'processed' lines)."""
    command = worker_command(
        "--burst",
        "--concurrency",
        str(settings.concurrency),
        "--batch-size",
        str(settings.batch),
        *options,
    )
    env = worker_env(settings.dsn, schema)
    started = time.perf_counter()
    proc = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise BenchError(f"worker exited with {proc.returncode}: {proc.stderr.strip()[-2000:]}")
    lines = list(WORKER_LINE.finditer(proc.stdout))
    if not lines:
        raise BenchError(f"no 'processed ...' line in the worker's output: {proc.stdout!r}")
    return wall, lines


def run_processes(
    commands: Sequence[Sequence[str]],
    env: dict[str, str],
    cwd: pathlib.Path = REPO_ROOT,
    timeout: float = PROCESS_TIMEOUT,
) -> tuple[float, list[str]]:
    """Start every command at once and wait for all of them: (seconds from the first spawn
    to the last exit, each one's stdout). Any failure is a BenchError."""
    what = " ".join(commands[0][3:6])  # python -P -m MODULE ...: the module and its words
    started = time.perf_counter()
    procs = [
        subprocess.Popen(
            list(c), cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for c in commands
    ]
    outputs: list[tuple[int, str, str]] = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=max(1.0, timeout - (time.perf_counter() - started)))
            outputs.append((proc.returncode, out, err))
    except subprocess.TimeoutExpired:
        raise BenchError(f"{what} took more than {timeout:g} s") from None
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    wall = time.perf_counter() - started
    for code, _out, err in outputs:
        if code != 0:
            raise BenchError(f"{what} exited with {code}: {err[-2000:]}")
    return wall, [out for _code, out, _err in outputs]


def require_packages(*packages: str) -> None:
    missing = [p for p in packages if importlib.util.find_spec(p) is None]
    if missing:
        raise ScenarioUnavailable(f"{', '.join(missing)} not installed ({BENCH_EXTRA})")


def package_version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


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


def resolve_bench_dsn(explicit: str | None) -> str:
    """The --dsn flag, else $LEASEQ_DSN, else leaseq's embedded server (started if need be)."""
    if explicit:
        return explicit
    from_env = os.environ.get("LEASEQ_DSN", "").strip()
    if from_env:
        return from_env
    from leaseq.dev.embedded import embedded_dsn

    return embedded_dsn()


# -- timing -----------------------------------------------------------------------------


def percentile(values: Sequence[float], pct: int) -> float:
    """The pct-th percentile (1-99), interpolated between the two nearest values."""
    if len(values) < 2:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[pct - 1]


def ms(seconds: float) -> float:
    return seconds * 1000.0


def size_label(n: int) -> str:
    """10000 -> 10k, 1000000 -> 1M (other numbers as they are)."""
    if n >= 1_000_000 and n % 1_000_000 == 0:
        return f"{n // 1_000_000}M"
    if n >= 1000 and n % 1000 == 0:
        return f"{n // 1000}k"
    return str(n)


# -- rounds and ratios ------------------------------------------------------------------


def select_scenarios(patterns: Sequence[str], scenarios: Sequence[Scenario]) -> list[Scenario]:
    """The scenarios ``--only`` names (globs; ``all`` for every one), in canonical order;
    without ``--only``, the default ones."""
    if not patterns:
        return [s for s in scenarios if s.default]
    wanted = [p.strip() for item in patterns for p in item.split(",") if p.strip()]
    chosen: list[Scenario] = []
    for pattern in wanted:
        hits = [s for s in scenarios if pattern == "all" or fnmatch.fnmatchcase(s.name, pattern)]
        if not hits:
            names = ", ".join(s.name for s in scenarios)
            raise SystemExit(f"bench: error: no scenario matches {pattern!r} (have: {names})")
        chosen.extend(s for s in hits if s not in chosen)
    # Keep the canonical order: a raw scenario runs right before its leaseq twin.
    return [s for s in scenarios if s in chosen]


RoundListener = Callable[[int, Scenario, dict[str, Sample]], None]


def run_rounds(
    scenarios: Sequence[Scenario],
    settings: Settings,
    series: dict[str, Series],
    on_sample: RoundListener,
) -> dict[str, str]:
    """``settings.repeat`` rounds, each running every scenario once in order, so drift of
    the machine hits all of them alike. Samples go into ``series`` (by metric key) and to
    ``on_sample``; returns the scenarios that raised ScenarioUnavailable, with the reason
    (they are not tried again). A BenchError stops the run."""
    unavailable: dict[str, str] = {}
    for round_no in range(1, settings.repeat + 1):
        for scenario in scenarios:
            if scenario.name in unavailable:
                continue
            try:
                samples = scenario.fn(settings)
            except ScenarioUnavailable as exc:
                unavailable[scenario.name] = str(exc)
                print(f"{scenario.name}: skipped: {exc}", file=sys.stderr, flush=True)
                continue
            for key, sample in samples.items():
                series[key].samples.append(sample)
            on_sample(round_no, scenario, samples)
    for scenario in scenarios:
        if scenario.finish is not None and scenario.name not in unavailable:
            scenario.finish(series)
    return unavailable


def spread(values: Sequence[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def round_ratios(series: dict[str, Series], ratio: Ratio) -> list[float] | None:
    """The ratio of each round's two samples; None unless both metrics were measured."""
    num, den = series.get(ratio.numerator), series.get(ratio.denominator)
    if num is None or den is None or not num.samples or not den.samples:
        return None
    pairs = zip(num.figures(), den.figures(), strict=False)
    return [b / a if ratio.inverse else a / b for a, b in pairs]


def ran(series: dict[str, Series], scenario: str) -> bool:
    return any(s.samples and s.metric.scenario == scenario for s in series.values())
