"""A seeded chaos run: real worker processes drain jobs while faults are injected, then the
invariants are checked on what the database and the execution logs say.

Layout of one run (``ChaosRun(config).run()``):

1. A private PostgreSQL (``EmbeddedServer`` in a directory of its own, on a free port), so
   the run may restart it. One ``FaultProxy`` per worker slot; worker ``k`` always reaches
   the database through proxy ``k`` (its LISTEN connection too).
2. ``workers`` processes of ``leaseq worker tests.chaos.app:app`` with a short lease and
   sweep interval. ``jobs`` jobs are enqueued before the chaos starts, scheduled (``run_at``)
   to become due evenly over the first 90% of the chaos window, so work is in flight for
   every fault; a few are ``flaky`` (Retry on their first attempt) and a few ``poison``
   (Permanent: they must end dead with ``CHAOS_POISON``). Handlers are async and sync.
3. The fault schedule is a pure function of the seed, the window, the number of workers,
   the lease, the sweep interval and the mean gap between faults (``make_schedule``): the
   same ``--seed`` gives the same schedule (printed with a fingerprint). Kinds:

   ``kill``        SIGKILL the slot's worker; a replacement starts ``hold`` seconds later.
   ``stop``        SIGSTOP it for ``hold`` seconds (always longer than lease + sweep), SIGCONT.
   ``shutdown``    SIGTERM it (the release path: its prefetched, unstarted leases go back at
                   once, running handlers get the shutdown timeout); once it has exited, a
                   replacement starts ``hold`` seconds later.
   ``terminate``   ``pg_terminate_backend`` of up to ``count`` random backends whose
                   application_name starts with ``leaseq`` (chosen with ``Random(pick)``).
   ``pg_restart``  stop PostgreSQL (fast shutdown); start it again ``hold`` seconds later.
   ``drop``        reset every connection through the slot's proxy.
   ``stall``       the slot's proxy moves no bytes for ``hold`` seconds, then resumes.
   ``half_open``   the slot's connections are reset on the server side and left hanging on
                   the worker's side; after ``hold`` seconds they are reset there too (what
                   TCP keepalive or a firewall timeout would eventually do).

4. After the window (and every follow-up of it) nothing is broken any more: the run waits
   until no job is pending or running, stops the workers with SIGTERM, and checks.

The checks (``check``), on the jobs table, the ``chaos_effects`` rows written inside the
fenced transactions, and the execution logs the handlers write outside any transaction:

1. every job is terminal: succeeded, or dead with ``CHAOS_POISON`` (poison jobs) or with
   its attempts used up (reported); none lost, none invented, none pending or running;
2. no success under a stale token: each succeeded job's row carries the job's final
   ``lease_token``, and an execution under that token exists; an execution told its
   transaction committed had the final token; no execution ran under a token the job never
   reached;
3. in-database effects exactly once: one row per succeeded job, none for the others;
4. duplicate execution is bounded: for every two executions of one job under different
   tokens, the time the stale one (older token) ran its handler code outside its fenced
   transaction while the newer one was running is at most lease + sweep interval +
   ``margin`` (a SIGSTOPped process is not running). Overlaps of the whole executions are
   measured and printed too; they also count the time a stale handler stays blocked inside
   its fenced transaction (on a stalled or half-open connection) whose commit the fence
   refuses, and are held to the same bound only with ``strict_window``.

With ``capabilities`` (the default; ``--no-capabilities`` turns it off) every capability
runs its own workload beside the plain jobs, one module each in tests/chaos/caps/ (unique
keys, concurrency limits, schedules, dependencies, batches, stored results): a sampler
thread asks each of them every 100 ms what is wrong at that instant, and each checks what
is left after the run (workers stopped, a last sweep); see tests/chaos/caps/suite.py. The
workers run with ``prefetch`` leases beyond their slots, so a ``shutdown`` fault releases
unstarted leases.

Also reported, not asserted: worker processes that exited without being asked to (and were
restarted), handler errors by type, tracebacks in worker logs, job events by code.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import math
import os
import pathlib
import random
import shutil
import signal
import tempfile
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import psycopg
import psycopg.conninfo
from psycopg import sql

import leaseq
from leaseq.dev.embedded import EmbeddedServer
from tests.chaos.app import CAP_QUEUES, EFFECTS_TABLE, MAX_ATTEMPTS, POISON_CODE, effects_ddl
from tests.chaos.caps.base import CapContext
from tests.chaos.caps.suite import CapSuite
from tests.chaos.execlog import Execution, read_executions
from tests.support.faults import FaultProxy
from tests.support.ports import free_port
from tests.support.procs import WorkerProcess

APP = "tests.chaos.app:app"
SCHEMA = "chaos"
HARNESS_APPLICATION_NAME = "chaos-harness"  # never matches the 'leaseq%' the faults target

KINDS = ("kill", "stop", "terminate", "pg_restart", "drop", "stall", "half_open", "shutdown")
_WEIGHTS = (2, 2, 3, 1, 2, 2, 1, 1)
_PROC_KINDS = ("kill", "stop", "shutdown")
_SHUTDOWN_AGE = 6.0  # a worker younger than this is not shut down (it may still be starting)
_SHUTDOWN_BUSY = 8.0  # a slot shut down is left alone this long (its exit waits for handlers)
_NET_KINDS = ("drop", "stall", "half_open")
_STARTUP = 2.0  # seconds a replacement worker is given before its slot may be hit again


# -- configuration and schedule -------------------------------------------------------------


@dataclass(frozen=True)
class ChaosConfig:
    seed: int
    jobs: int = 2000
    workers: int = 3
    concurrency: int = 12
    #: The chaos window: faults start only inside it (their follow-ups may end a bit later).
    seconds: float = 30.0
    lease: float = 1.5
    sweep: float = 0.5
    poll: float = 0.25
    op_timeout: float = 2.0
    #: Mean seconds between two faults (exponential inter-arrival times).
    fault_gap: float = 1.2
    #: Allowance for process scheduling in the duplicate-execution bound.
    margin: float = 1.0
    #: Handler work, uniform in this range (seconds), in steps of about 50 ms ...
    work: tuple[float, float] = (0.02, 0.3)
    #: ... except for this share of jobs, which work longer than a lease (renewed by their
    #: progress), so a worker that loses one can overlap with the next owner's run.
    long_share: float = 0.03
    long_work: tuple[float, float] = (2.0, 5.0)
    sync_share: float = 0.5
    flaky_share: float = 0.03
    poison_share: float = 0.01
    drain_timeout: float = 90.0
    #: Leases a worker holds beyond its free slots: what a shutdown releases unstarted.
    prefetch: int = 4
    #: Run every capability's workload beside the plain jobs, sampled and checked
    #: (tests/chaos/caps/).
    capabilities: bool = True
    #: The database's default_transaction_isolation for the run (None: the server's,
    #: read committed): leaseq must hold every invariant whatever it is.
    isolation: str | None = None
    #: Also hold whole executions to the bound, counting the time a stale handler stays
    #: blocked inside its fenced transaction (see the README's duplicate-execution promise).
    strict_window: bool = False
    #: Keep the run directory (worker logs, execution logs) even when every check passed.
    keep: bool = False
    base_dir: pathlib.Path | None = None
    verbose: bool = False

    @property
    def bound(self) -> float:
        return self.lease + self.sweep + self.margin

    def schedule(self) -> tuple[Fault, ...]:
        return make_schedule(
            self.seed,
            seconds=self.seconds,
            workers=self.workers,
            lease=self.lease,
            sweep=self.sweep,
            gap=self.fault_gap,
        )

    def command(self) -> str:
        """The command that runs this configuration again (same schedule, same jobs)."""
        command = (
            f"python -m tests.chaos --seed {self.seed} --jobs {self.jobs} "
            f"--seconds {self.seconds:g} --workers {self.workers} "
            f"--concurrency {self.concurrency} --lease {self.lease:g} --sweep {self.sweep:g} "
            f"--fault-gap {self.fault_gap:g} --margin {self.margin:g} "
            f"--long-share {self.long_share:g}"
        )
        command += "" if self.capabilities else " --no-capabilities"
        command += f" --isolation '{self.isolation}'" if self.isolation else ""
        return command + (" --strict-window" if self.strict_window else "")


@dataclass(frozen=True)
class Fault:
    """One scheduled fault, ``at`` seconds into the window."""

    at: float
    kind: str
    slot: int
    hold: float = 0.0
    count: int = 0
    pick: int = 0

    def describe(self) -> str:
        if self.kind == "terminate":
            return f"t+{self.at:6.2f}s terminate up to {self.count} leaseq backend(s)"
        if self.kind == "pg_restart":
            return f"t+{self.at:6.2f}s pg_restart (down {self.hold:.2f}s)"
        what = {
            "kill": "kill -9, replacement after",
            "stop": "SIGSTOP for",
            "drop": "drop all connections",
            "stall": "stall proxy for",
            "half_open": "half-open connections for",
            "shutdown": "SIGTERM (shutdown release), replacement after its exit +",
        }[self.kind]
        hold = f" {self.hold:.2f}s" if self.kind != "drop" else ""
        return f"t+{self.at:6.2f}s slot {self.slot}: {what}{hold}"


def make_schedule(
    seed: int, *, seconds: float, workers: int, lease: float, sweep: float, gap: float
) -> tuple[Fault, ...]:
    """The fault schedule: a pure function of its arguments, driven by ``Random(seed)``.

    Every kind appears once early on (in a seeded order) when the window is long enough,
    then kinds are drawn by weight. Two faults never hit one worker process (kill, stop) or
    one proxy (drop, stall, half-open) at once, nor do two restarts overlap: a fault that
    would is moved to the next free slot, or left out.
    """
    rng = random.Random(seed)
    first = list(KINDS)
    rng.shuffle(first)
    proc_free = [0.0] * workers
    net_free = [0.0] * workers
    pg_free = 0.0
    faults: list[Fault] = []
    t = rng.uniform(0.5, max(0.5, gap))
    while t < seconds:
        kind = first.pop(0) if first else rng.choices(KINDS, _WEIGHTS)[0]
        slot = rng.randrange(workers)
        if kind in ("kill", "shutdown"):
            hold = rng.uniform(0.2, 1.5)
        elif kind == "stop":
            hold = rng.uniform(lease + sweep + 0.2, lease + sweep + 2.5)
        elif kind == "pg_restart":
            hold = rng.uniform(0.3, 2.5)
        elif kind == "stall":
            hold = rng.uniform(0.3, 4.0)
        elif kind == "half_open":
            hold = rng.uniform(1.0, 5.0)
        else:
            hold = 0.0
        count = rng.randint(1, 4) if kind == "terminate" else 0
        pick = rng.getrandbits(32)
        chosen: int | None = slot
        if kind in _PROC_KINDS or kind in _NET_KINDS:
            free = proc_free if kind in _PROC_KINDS else net_free
            order = [(slot + i) % workers for i in range(workers)]
            chosen = next((s for s in order if free[s] <= t), None)
            if chosen is not None:
                free[chosen] = (
                    t
                    + hold
                    + (
                        _STARTUP
                        if kind == "kill"
                        else _SHUTDOWN_BUSY
                        if kind == "shutdown"
                        else 0.0
                    )
                )
        elif kind == "pg_restart":
            if pg_free > t:
                chosen = None
            else:
                pg_free = t + hold + 3.0
        if chosen is not None:
            faults.append(Fault(round(t, 3), kind, chosen, round(hold, 3), count, pick))
        t += rng.expovariate(1.0 / gap)
    return tuple(faults)


def fingerprint(schedule: Iterable[Fault]) -> str:
    return hashlib.sha256(repr(tuple(schedule)).encode()).hexdigest()[:12]


# -- one run ----------------------------------------------------------------------------------


@dataclass(eq=False)
class _Proc:
    """One worker process (a slot gets a new one after each kill)."""

    slot: int
    worker: WorkerProcess
    started: float
    killed_at: float | None = None
    exited_at: float | None = None
    exit_code: int | None = None
    #: [since, until] of each SIGSTOP; until is None while still stopped.
    stops: list[list[float | None]] = field(default_factory=list)
    by_harness: bool = False  # its exit was caused by the harness (kill, final SIGTERM)
    #: Set by a shutdown fault: once it exited, its slot gets a new worker this much later.
    shutdown_hold: float | None = None

    @property
    def pid(self) -> int:
        return self.worker.pid

    @property
    def gone_at(self) -> float | None:
        return self.killed_at if self.killed_at is not None else self.exited_at

    def frozen(self) -> list[tuple[float, float]]:
        end = self.gone_at if self.gone_at is not None else time.time()
        return [(since, until if until is not None else end) for since, until in self.stops]  # type: ignore[misc]


@dataclass
class Overlap:
    job: int
    early: Execution
    late: Execution
    #: Both running at all (frozen time excluded), over the whole executions.
    seconds: float
    #: The stale (earlier-token) one running its handler code *outside* its fenced
    #: transaction while the later one ran: the duplicate work the promise bounds.
    stale_work: float
    #: How long the stale one was inside its fenced transaction (blocked on the database,
    #: typically), whose commit the fence refuses.
    early_in_tx: float


@dataclass
class ChaosReport:
    config: ChaosConfig
    fingerprint: str
    scheduled: Counter[str]
    applied: Counter[str]
    skipped: Counter[str]
    backends_terminated: int
    connections_dropped: int
    chaos_seconds: float
    drain_seconds: float
    total_seconds: float
    statuses: Counter[str]
    dead_codes: Counter[str]
    exhausted: list[tuple[int, str]]
    jobs_in: int
    jobs_out: int
    executions: int
    duplicate_attempts: int
    attempt_outcomes: Counter[str]
    errors: Counter[str]
    fenced_rows: int
    overlaps: list[Overlap]
    events: Counter[str]
    workers_started: int
    unexpected_exits: list[str]
    tracebacks: int
    violations: dict[str, list[str]]
    run_dir: pathlib.Path | None = None
    #: The capability part's figures (tests/chaos/caps/suite.py), printed with the summary.
    capabilities: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not any(self.violations.values())

    @property
    def max_overlap(self) -> float:
        return max((o.seconds for o in self.overlaps), default=0.0)

    @property
    def max_stale_work(self) -> float:
        return max((o.stale_work for o in self.overlaps), default=0.0)

    @property
    def above_bound(self) -> list[Overlap]:
        return [o for o in self.overlaps if o.seconds > self.config.bound]

    def summary(self) -> str:
        cfg = self.config

        def counts(c: Counter[str]) -> str:
            return " ".join(f"{k}={c[k]}" for k in sorted(c)) or "-"

        lines = [
            f"chaos seed={cfg.seed} schedule={self.fingerprint} jobs={cfg.jobs} "
            f"workers={cfg.workers}x{cfg.concurrency} lease={cfg.lease:g}s "
            f"sweep={cfg.sweep:g}s window={cfg.seconds:g}s"
            + (f" isolation={cfg.isolation}" if cfg.isolation else ""),
            f"  faults scheduled {sum(self.scheduled.values())}: {counts(self.scheduled)}",
            f"  faults applied   {sum(self.applied.values())}: {counts(self.applied)}"
            + (f" (skipped: {counts(self.skipped)})" if self.skipped else ""),
            f"  backends terminated {self.backends_terminated}, proxied connections reset "
            f"{self.connections_dropped}, worker processes started {self.workers_started}",
            f"  duration: chaos {self.chaos_seconds:.1f}s, drain after it "
            f"{self.drain_seconds:.1f}s, whole run {self.total_seconds:.1f}s",
            f"  jobs in {self.jobs_in}, out {self.jobs_out}: {counts(self.statuses)}; "
            f"dead by code: {counts(self.dead_codes)}",
            f"  executions {self.executions}, fenced rows {self.fenced_rows}, "
            f"duplicate attempts {self.duplicate_attempts} ({counts(self.attempt_outcomes)})",
            f"  overlapping executions {len(self.overlaps)} (in "
            f"{len({o.job for o in self.overlaps})} jobs); bound {cfg.bound:.2f}s = lease "
            f"{cfg.lease:g} + sweep {cfg.sweep:g} + margin {cfg.margin:g}",
            f"    max overlap of stale handler code with the new owner "
            f"{self.max_stale_work:.3f}s (checked against the bound)",
            f"    max overlap of whole executions {self.max_overlap:.3f}s; above the bound: "
            f"{len(self.above_bound)} (stale one blocked in its fenced transaction; "
            f"{'checked' if cfg.strict_window else 'reported only, see --strict-window'})",
            f"  job events: {counts(self.events)}",
        ]
        for o in sorted(self.overlaps, key=lambda o: (-o.stale_work, -o.seconds))[:3]:
            lines.append(
                f"    job {o.job}: token {o.early.token} ({o.early.outcome or 'killed'}, "
                f"{o.early_in_tx:.3f}s in its fenced tx) with token {o.late.token} "
                f"({o.late.outcome or 'killed'}): whole {o.seconds:.3f}s, stale code "
                f"{o.stale_work:.3f}s"
            )
        if self.errors:
            lines.append("  handler errors:")
            lines += [f"    {n:4d} {text}" for text, n in self.errors.most_common(8)]
        if self.exhausted:
            lines.append(f"  dead after using up their attempts: {self.exhausted[:10]}")
        if self.unexpected_exits:
            lines.append(f"  worker exits nobody asked for: {len(self.unexpected_exits)}")
            lines += [f"    {e}" for e in self.unexpected_exits[:5]]
        if self.tracebacks:
            lines.append(f"  tracebacks in worker logs: {self.tracebacks}")
        lines += self.capabilities
        for check, found in self.violations.items():
            lines.append(f"  check {check}: {'ok' if not found else f'FAILED ({len(found)})'}")
            lines += [f"    {v}" for v in found[:10]]
        if self.run_dir is not None:
            lines.append(f"  run directory (logs): {self.run_dir}")
        return "\n".join(lines)

    def assert_ok(self) -> None:
        if not self.ok:
            failed = ", ".join(k for k, v in self.violations.items() if v)
            raise AssertionError(
                f"chaos invariants violated with seed={self.config.seed} ({failed}); "
                f"reproduce with: {self.config.command()}\n{self.summary()}"
            )


CHECKS = (
    "1 all terminal, none lost",
    "2 no stale success",
    "3 effects exactly once",
    "4 duplicate window bounded",
)


class ChaosRun:
    def __init__(self, config: ChaosConfig, say: Callable[[str], None] = print) -> None:
        self.cfg = config
        self.say = say
        self.schedule = config.schedule()
        self.procs: list[_Proc] = []
        self.slots: list[_Proc | None] = [None] * config.workers
        self.applied: Counter[str] = Counter()
        self.skipped: Counter[str] = Counter()
        self.terminated = 0
        self.dropped = 0
        self.unexpected: list[str] = []
        self.fault_log: list[str] = []
        self._respawn_after: dict[int, float] = {}
        self._failures: dict[int, int] = {}  # consecutive early exits per slot
        self._hit: dict[int, _Proc] = {}
        self._pg_down = False
        self._outages: list[list[float | None]] = []  # [down, up] of each restart

    # -- the whole run ----------------------------------------------------------------------

    def run(self) -> ChaosReport:
        cfg = self.cfg
        began = time.monotonic()
        base = self._base_dir()
        self.logs = base / "logs"
        self.exec_dir = base / "exec"
        self.logs.mkdir(parents=True)
        self.exec_dir.mkdir()
        (self.exec_dir / "caps").mkdir()
        self.say(
            f"chaos: seed={cfg.seed} schedule={fingerprint(self.schedule)} "
            f"({len(self.schedule)} faults) jobs={cfg.jobs} workers={cfg.workers} "
            f"window={cfg.seconds:g}s dir={base}"
        )
        report: ChaosReport | None = None
        self.server = EmbeddedServer(base / "pg", port=free_port())
        try:
            self.dsn = self.server.ensure_running()
            self._setup_db()
            self.caps: CapSuite | None = None
            if cfg.capabilities:
                self.caps = CapSuite(self._cap_context())
                self.caps.setup()
            port = int(psycopg.conninfo.conninfo_to_dict(self.dsn)["port"])  # type: ignore[arg-type]
            self.proxies = [FaultProxy("127.0.0.1", port) for _ in range(cfg.workers)]
            for proxy in self.proxies:
                proxy.start()
            try:
                for slot in range(cfg.workers):
                    self._spawn(slot)
                t0 = self._enqueue()
                chaos_start = time.monotonic()
                if self.caps is not None:
                    self.caps.start()
                self._inject(t0)
                chaos_end = time.monotonic()
                if self.caps is not None:
                    self.caps.window_over()
                self._heal()
                self._drain()
                drained = time.monotonic()
                self._stop_workers()
                self._last_sweep()
                if self.caps is not None:
                    self.caps.stop()
                    self.caps.final()
            finally:
                for p in self.procs:
                    p.worker.kill()  # if still running; closes its log file either way
                for proxy in self.proxies:
                    with contextlib.suppress(Exception):
                        proxy.stop()
            report = self._analyze(
                chaos=chaos_end - chaos_start,
                drain=drained - chaos_end,
                total=time.monotonic() - began,
            )
        finally:
            with contextlib.suppress(Exception):
                self.server.stop()
            (base / "faults.log").write_text("\n".join(self.fault_log) + "\n")
            keep = cfg.keep or report is None or not report.ok
            if keep:
                shutil.rmtree(base / "pg", ignore_errors=True)
                if report is not None:
                    report.run_dir = base
            else:
                shutil.rmtree(base, ignore_errors=True)
        assert report is not None
        return report

    def _base_dir(self) -> pathlib.Path:
        name = f"leaseq-chaos-{self.cfg.seed}-{uuid.uuid4().hex[:6]}"
        if self.cfg.base_dir is not None:
            parent = self.cfg.base_dir
        elif os.geteuid() == 0:
            parent = pathlib.Path("/var/tmp")  # the server account must reach the data dir
        else:
            parent = pathlib.Path(tempfile.gettempdir())
        base = parent / name
        base.mkdir(parents=True)
        if os.geteuid() == 0:
            base.chmod(0o755)
        return base

    def _connect(self) -> psycopg.Connection[Any]:
        return psycopg.connect(
            self.dsn, autocommit=True, application_name=HARNESS_APPLICATION_NAME, connect_timeout=5
        )

    def _cap_context(self) -> CapContext:
        start = dt.datetime.now(dt.UTC)  # set again by _enqueue, once the window is known
        out = self.exec_dir / "caps"
        return CapContext(self.dsn, self.cfg.seed, out, start, self.cfg.seconds, self.cfg.lease)

    def _last_sweep(self) -> None:
        """After every worker stopped: a sweep, as the next worker would run first."""
        client = leaseq.Client(self.dsn, schema=SCHEMA, application_name=HARNESS_APPLICATION_NAME)
        try:
            client.sweep()
        finally:
            client.close()

    def _setup_db(self) -> None:
        client = leaseq.Client(self.dsn, schema=SCHEMA)
        try:
            client.migrate()
        finally:
            client.close()
        with self._connect() as conn:
            conn.execute(effects_ddl(SCHEMA))
            if cfg_isolation := self.cfg.isolation:
                ((db,),) = conn.execute("SELECT current_database()")
                conn.execute(
                    sql.SQL("ALTER DATABASE {} SET default_transaction_isolation = {}").format(
                        sql.Identifier(db), sql.Literal(cfg_isolation)
                    )
                )

    def _enqueue(self) -> float:
        """Store every job, due evenly over the first 90% of the window; returns the
        monotonic time the window starts at."""
        cfg = self.cfg
        rng = random.Random(f"{cfg.seed}:jobs")
        # The capabilities enqueue after the plain jobs (batches: two statements each).
        lead = 2.0 + cfg.jobs / 20000 + (3.0 + 0.02 * cfg.seconds if cfg.capabilities else 0.0)
        start_wall = time.time() + lead
        start = time.monotonic() + lead
        base = dt.datetime.fromtimestamp(start_wall, dt.UTC)
        spread = cfg.seconds * 0.9
        specs = []
        for seq in range(cfg.jobs):
            roll = rng.random()
            mode = (
                "poison"
                if roll < cfg.poison_share
                else "flaky"
                if roll < cfg.poison_share + cfg.flaky_share
                else "ok"
            )
            work = rng.uniform(*(cfg.long_work if rng.random() < cfg.long_share else cfg.work))
            steps = max(1, round(work / 0.05))
            task = "chaos.sync" if rng.random() < cfg.sync_share else "chaos.async"
            payload = {
                "seq": seq,
                "n": steps,
                "s": round(work / steps, 4),
                "mode": mode,
                "out": str(self.exec_dir),
            }
            run_at = base + dt.timedelta(seconds=spread * seq / cfg.jobs)
            specs.append(leaseq.JobSpec(task, payload, run_at=run_at, max_attempts=MAX_ATTEMPTS))
        client = leaseq.Client(self.dsn, schema=SCHEMA, application_name=HARNESS_APPLICATION_NAME)
        try:
            for i in range(0, len(specs), 2000):
                client.enqueue_many(specs[i : i + 2000])
        finally:
            client.close()
        if self.caps is not None:
            self.caps.ctx.start = base
            self.caps.enqueue()
        if time.monotonic() > start:
            self.say(f"chaos: enqueueing took {time.monotonic() - start + lead:.1f}s")
        return start

    # -- workers ----------------------------------------------------------------------------

    def _spawn(self, slot: int) -> _Proc:
        cfg = self.cfg
        args = (
            "--concurrency",
            str(cfg.concurrency),
            "--batch-size",
            str(cfg.concurrency),
            "--lease-seconds",
            str(cfg.lease),
            "--sweep-interval",
            str(cfg.sweep),
            "--poll-interval",
            str(cfg.poll),
            "--op-timeout",
            str(cfg.op_timeout),
            "--shutdown-timeout",
            "15",
            "--prefetch",
            str(cfg.prefetch),
            # Slots are split by weight between queues that have work: the limited queues
            # always have some (held back by their limits), the plain jobs need the most.
            "--queue",
            "default=6",
            *(arg for queue in CAP_QUEUES for arg in ("--queue", f"{queue}=2")),
        )
        worker = WorkerProcess(
            self.proxies[slot].dsn(self.dsn), SCHEMA, *args, log_dir=self.logs, app=APP
        )
        proc = _Proc(slot, worker, time.time())
        self.procs.append(proc)
        self.slots[slot] = proc
        self._note(f"slot {slot}: worker pid {worker.pid} started")
        return proc

    def _watch(self) -> None:
        """Notice workers that exited by themselves; restart them (not too eagerly)."""
        now = time.time()
        for slot, proc in enumerate(self.slots):
            if proc is None:
                due = self._respawn_after.get(slot)
                if due is not None and time.monotonic() >= due:
                    del self._respawn_after[slot]
                    self._spawn(slot)
                continue
            code = proc.worker.proc.poll()
            if code is None:
                continue
            proc.exited_at = now
            proc.exit_code = code
            self.slots[slot] = None
            if proc.shutdown_hold is not None:
                self._respawn_after[slot] = time.monotonic() + proc.shutdown_hold
                if code not in (0, 3):
                    self.unexpected.append(f"pid {proc.pid} exited {code} at a shutdown fault")
            if not proc.by_harness:
                tail = " | ".join(proc.worker.output().strip().splitlines()[-3:])
                down = any(
                    lo is not None and lo <= now and (hi is None or hi >= proc.started)
                    for lo, hi in self._outages
                )
                db = "PostgreSQL restarted during its life" if down else "PostgreSQL up"
                self.unexpected.append(f"pid {proc.pid} exited {code} ({db}): {tail[-300:]}")
                self._note(f"slot {slot}: worker pid {proc.pid} exited {code} by itself")
                # Back off while a slot keeps dying (e.g. the database is unreachable).
                early = now - proc.started < 10.0
                self._failures[slot] = self._failures.get(slot, 0) + 1 if early else 1
                delay = min(5.0, 0.5 * 2 ** (self._failures[slot] - 1))
                self._respawn_after[slot] = time.monotonic() + delay

    def _stop_workers(self) -> None:
        live = [p for p in self.slots if p is not None and p.worker.proc.poll() is None]
        for proc in live:
            proc.by_harness = True
            proc.worker.signal(signal.SIGTERM)
        for proc in live:
            try:
                proc.exit_code = proc.worker.wait(40)
            except Exception:
                self.unexpected.append(f"pid {proc.pid} did not stop within 40s of SIGTERM")
                proc.worker.kill()
                proc.exit_code = proc.worker.proc.returncode
            proc.exited_at = time.time()
            if proc.exit_code not in (0, 3):
                self.unexpected.append(f"pid {proc.pid} exited {proc.exit_code} at SIGTERM")

    # -- faults -----------------------------------------------------------------------------

    def _note(self, text: str) -> None:
        line = f"{time.time():.3f} {text}"
        self.fault_log.append(line)
        if self.cfg.verbose:
            self.say(line)

    def _inject(self, start: float) -> None:
        actions: list[tuple[float, int, str, int]] = []
        follow = {
            "kill": "respawn",
            "stop": "cont",
            "pg_restart": "pg_start",
            "stall": "resume",
            "half_open": "drop_half_open",
        }
        for i, f in enumerate(self.schedule):
            actions.append((f.at, 2 * i, f.kind, i))
            if f.kind in follow:
                actions.append((f.at + f.hold, 2 * i + 1, follow[f.kind], i))
        actions.sort()
        while time.monotonic() < start:
            self._watch()
            time.sleep(0.05)
        for at, _, op, i in actions:
            while time.monotonic() < start + at:
                self._watch()
                time.sleep(0.01)
            self._watch()
            self._apply(op, self.schedule[i], i)
        # The window itself lasts its full length even if the last fault came early.
        while time.monotonic() < start + self.cfg.seconds:
            self._watch()
            time.sleep(0.05)

    def _apply(self, op: str, fault: Fault, index: int) -> None:
        slot = fault.slot
        proc = self.slots[slot] if fault.kind in _PROC_KINDS else None
        if op in _PROC_KINDS:
            if proc is None or proc.worker.proc.poll() is not None:
                self.skipped[op] += 1
                self._note(f"{fault.describe()}: skipped, no live worker in the slot")
                return
            if op == "shutdown" and time.time() - proc.started < _SHUTDOWN_AGE:
                # Before it installs its signal handlers SIGTERM just ends the process (-15):
                # that would be a kill, not the release path this fault is for.
                self.skipped[op] += 1
                self._note(f"{fault.describe()}: skipped, the worker is still starting")
                return
            self._hit[index] = proc
        if op == "kill":
            assert proc is not None
            proc.killed_at = time.time()
            for stop in proc.stops:
                if stop[1] is None:
                    stop[1] = proc.killed_at
            proc.by_harness = True
            os.kill(proc.pid, signal.SIGKILL)
            proc.worker.proc.wait(10)
            proc.exited_at = proc.killed_at
            self.slots[slot] = None
            self._respawn_after.pop(slot, None)
        elif op == "shutdown":
            assert proc is not None
            proc.by_harness = True
            proc.shutdown_hold = fault.hold
            os.kill(proc.pid, signal.SIGTERM)
        elif op == "respawn":
            if index in self._hit and self.slots[slot] is None:
                self._spawn(slot)
            return  # a follow-up: not counted as a fault
        elif op == "stop":
            assert proc is not None
            proc.stops.append([time.time(), None])
            os.kill(proc.pid, signal.SIGSTOP)
        elif op == "cont":
            hit = self._hit.get(index)
            if hit is not None and hit.worker.proc.poll() is None and hit.killed_at is None:
                os.kill(hit.pid, signal.SIGCONT)
                hit.stops[-1][1] = time.time()
            return
        elif op == "terminate":
            self.terminated += self._terminate(fault)
        elif op == "pg_restart":
            self._pg_down = True
            self._outages.append([time.time(), None])
            try:
                self.server.stop()
            except Exception as exc:
                self._note(f"pg stop failed: {exc}")
        elif op == "pg_start":
            self.server.ensure_running()
            self._pg_down = False
            self._outages[-1][1] = time.time()
            return
        elif op == "drop":
            self.dropped += self.proxies[slot].drop_all()
        elif op == "stall":
            self.proxies[slot].stall()
        elif op == "resume":
            self.proxies[slot].resume()
            return
        elif op == "half_open":
            self.proxies[slot].half_open()
        elif op == "drop_half_open":
            self.dropped += self.proxies[slot].drop_all()
            return
        self.applied[fault.kind] += 1
        pid = f" (pid {proc.pid})" if proc is not None else ""
        self._note(f"{fault.describe()}{pid}")

    def _terminate(self, fault: Fault) -> int:
        try:
            with self._connect() as conn:
                pids = [
                    pid
                    for (pid,) in conn.execute(
                        "SELECT pid FROM pg_stat_activity WHERE application_name LIKE 'leaseq%%' "
                        "AND pid <> pg_backend_pid() ORDER BY pid"
                    )
                ]
                chosen = random.Random(fault.pick).sample(pids, min(fault.count, len(pids)))
                done = 0
                for pid in chosen:
                    ((ok,),) = conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
                    done += bool(ok)
                return done
        except psycopg.Error as exc:
            self._note(f"terminate: {exc}")
            return 0

    def _heal(self) -> None:
        """After the window: nothing stays broken (every follow-up has run; this is a net)."""
        if self._pg_down:
            self.server.ensure_running()
            self._pg_down = False
        for proxy in self.proxies:
            proxy.resume()
        for proc in self.procs:
            for stop in proc.stops:
                if stop[1] is None and proc.worker.proc.poll() is None:
                    os.kill(proc.pid, signal.SIGCONT)
                    stop[1] = time.time()

    def _drain(self) -> None:
        deadline = time.monotonic() + self.cfg.drain_timeout
        conn: psycopg.Connection[Any] | None = None
        left = -1
        while time.monotonic() < deadline:
            self._watch()
            try:
                if conn is None:
                    conn = self._connect()
                ((left,),) = conn.execute(
                    sql.SQL(
                        "SELECT count(*) FROM {}.jobs"
                        " WHERE status IN ('pending', 'running', 'suspended')"
                    ).format(sql.Identifier(SCHEMA))
                )
            except psycopg.Error:
                conn = None
            if left == 0:
                break
            time.sleep(0.25)
        if conn is not None:
            conn.close()
        if left:
            self._note(f"drain timed out with {left} job(s) not terminal")

    # -- the checks -------------------------------------------------------------------------

    def _analyze(self, *, chaos: float, drain: float, total: float) -> ChaosReport:
        cfg = self.cfg
        s = sql.Identifier(SCHEMA)
        with self._connect() as conn:
            jobs = conn.execute(
                sql.SQL(
                    "SELECT id, status::text, lease_token, attempt_count, max_attempts, "
                    "last_error_code, (payload->>'seq')::int, payload->>'mode' FROM {}.jobs "
                    "WHERE payload ? 'seq'"
                ).format(s)
            ).fetchall()
            rows = conn.execute(
                sql.SQL("SELECT job_id, token, worker, pid FROM {}.{}").format(
                    s, sql.Identifier(EFFECTS_TABLE)
                )
            ).fetchall()
            events = Counter(
                {
                    ":".join(filter(None, (event, code, cls))): n
                    for event, code, cls, n in conn.execute(
                        sql.SQL(
                            "SELECT event, error_code, error_class, count(*) "
                            "FROM {}.job_events GROUP BY 1, 2, 3"
                        ).format(s)
                    )
                }
            )
        executions = read_executions(self.exec_dir)
        procs = {p.pid: p for p in self.procs}
        result = check(cfg, jobs, rows, executions, procs)
        capabilities: list[str] = []
        if self.caps is not None:
            result["violations"].update(self.caps.violations())
            capabilities = self.caps.summary()
        tracebacks = sum(
            path.read_text(errors="replace").count("Traceback") for path in self.logs.glob("*.log")
        )
        return ChaosReport(
            config=cfg,
            fingerprint=fingerprint(self.schedule),
            scheduled=Counter(f.kind for f in self.schedule),
            applied=self.applied,
            skipped=self.skipped,
            backends_terminated=self.terminated,
            connections_dropped=self.dropped,
            chaos_seconds=chaos,
            drain_seconds=drain,
            total_seconds=total,
            events=events,
            workers_started=len(self.procs),
            unexpected_exits=self.unexpected,
            tracebacks=tracebacks,
            capabilities=capabilities,
            **result,
        )


# -- pure parts of the analysis ----------------------------------------------------------------


def _subtract(
    span: tuple[float, float], holes: list[tuple[float, float]]
) -> list[tuple[float, float]]:
    pieces = [span]
    for lo, hi in holes:
        nxt = []
        for a, b in pieces:
            if hi <= a or lo >= b:
                nxt.append((a, b))
                continue
            if lo > a:
                nxt.append((a, lo))
            if hi < b:
                nxt.append((hi, b))
        pieces = nxt
    return pieces


def _common(xs: list[tuple[float, float]], ys: list[tuple[float, float]]) -> float:
    return sum(max(0.0, min(b, d) - max(a, c)) for a, b in xs for c, d in ys)


def _end(ex: Execution, proc: _Proc | None) -> float:
    """When the execution ended: its E line, else the death of its process."""
    if ex.end is not None:
        return ex.end
    gone = proc.gone_at if proc is not None else None
    return gone if gone is not None else time.time()


def _running(ex: Execution, proc: _Proc | None, *, work_only: bool) -> list[tuple[float, float]]:
    """When the execution was running: from its start to its end (or to the death of its
    process, when it never logged an end), minus the time its process was frozen."""
    end = _end(ex, proc)
    if work_only and ex.tx is not None:
        end = min(end, ex.tx)
    return _subtract((ex.start, max(ex.start, end)), proc.frozen() if proc else [])


def check(
    cfg: ChaosConfig,
    jobs: list[tuple[Any, ...]],
    rows: list[tuple[Any, ...]],
    executions: list[Execution],
    procs: dict[int, _Proc],
) -> dict[str, Any]:
    """The four invariants, plus the figures; returns ChaosReport fields."""
    v: dict[str, list[str]] = {name: [] for name in CHECKS}
    c1, c2, c3, c4 = CHECKS
    statuses = Counter(j[1] for j in jobs)
    seqs = Counter(j[6] for j in jobs)
    if len(jobs) != cfg.jobs or set(seqs) != set(range(cfg.jobs)):
        missing = sorted(set(range(cfg.jobs)) - set(seqs))[:10]
        v[c1].append(f"{cfg.jobs} jobs enqueued, {len(jobs)} stored; missing seq {missing}")
    v[c1] += [f"seq {seq} stored {n} times" for seq, n in seqs.items() if n > 1]
    dead_codes: Counter[str] = Counter()
    exhausted: list[tuple[int, str]] = []
    by_job = {j[0]: j for j in jobs}
    for job_id, status, token, attempts, max_attempts, code, seq, mode in jobs:
        if status == "dead":
            dead_codes[code] += 1
            if mode == "poison" and code == POISON_CODE:
                continue
            if attempts >= max_attempts:
                exhausted.append((job_id, code))
                continue
            v[c1].append(f"job {job_id} (seq {seq}, {mode}) dead with {code} after {attempts}")
        elif status == "succeeded":
            if mode == "poison":
                v[c1].append(f"poison job {job_id} succeeded")
        else:
            v[c1].append(f"job {job_id} (seq {seq}) ended {status} (token {token})")

    row_map: dict[int, list[tuple[Any, ...]]] = defaultdict(list)
    for row in rows:
        row_map[row[0]].append(row)
    exec_map: dict[int, list[Execution]] = defaultdict(list)
    for ex in executions:
        exec_map[ex.job].append(ex)
    for job_id in row_map:
        if job_id not in by_job:
            v[c3].append(f"rows for unknown job {job_id}")
    for job_id, (_, status, token, *_rest) in by_job.items():
        found = row_map.get(job_id, [])
        if status == "succeeded":
            if len(found) != 1:
                v[c3].append(f"succeeded job {job_id} has {len(found)} rows: {found}")
            stale = [r for r in found if r[1] != token]
            if stale:
                v[c2].append(f"job {job_id} final token {token}, but rows under {stale}")
            if not any(ex.token == token for ex in exec_map.get(job_id, [])):
                v[c2].append(f"job {job_id}: no execution logged under its final token {token}")
            for r in found:
                match = [ex for ex in exec_map.get(job_id, []) if ex.token == r[1]]
                if match and all(ex.pid != r[3] for ex in match):
                    v[c2].append(f"job {job_id}: row by pid {r[3]}, execution by another")
        elif found:
            v[c3].append(f"job {job_id} is {status} but has rows {found}")
        for ex in exec_map.get(job_id, []):
            if ex.token > token:
                v[c2].append(f"job {job_id}: execution under token {ex.token} > final {token}")
            if ex.outcome == "committed" and (status != "succeeded" or ex.token != token):
                v[c2].append(
                    f"job {job_id}: token {ex.token} was told it committed, but the job is "
                    f"{status} under token {token}"
                )

    overlaps: list[Overlap] = []
    duplicate = 0
    outcomes: Counter[str] = Counter()
    for job_id, runs in exec_map.items():
        _, status, token, *_rest = by_job.get(job_id, (None, None, None))
        for ex in runs:
            if not (status == "succeeded" and ex.token == token):
                duplicate += 1
                outcomes[ex.outcome or "no end (process killed)"] += 1
        runs.sort(key=lambda e: (e.start, e.token))
        for i, a in enumerate(runs):
            for b in runs[i + 1 :]:
                if a.token == b.token:
                    continue
                pa, pb = procs.get(a.pid), procs.get(b.pid)
                both = _common(_running(a, pa, work_only=False), _running(b, pb, work_only=False))
                if both <= 0:
                    continue
                early, late = (a, b) if a.token < b.token else (b, a)
                pe, pl = procs.get(early.pid), procs.get(late.pid)
                early_whole = _running(early, pe, work_only=False)
                stale = _common(
                    _running(early, pe, work_only=True), _running(late, pl, work_only=False)
                )
                in_tx = 0.0 if early.tx is None else _common(early_whole, [(early.tx, math.inf)])
                overlaps.append(Overlap(job_id, early, late, both, stale, in_tx))
                what = (
                    f"job {job_id}: stale token {early.token} (pid {early.pid}, "
                    f"{early.outcome or 'killed'}, {in_tx:.3f}s in its fenced tx) and token "
                    f"{late.token} (pid {late.pid}, {late.outcome or 'killed'})"
                )
                if stale > cfg.bound:
                    v[c4].append(f"{what}: stale handler code ran {stale:.3f}s alongside")
                elif cfg.strict_window and both > cfg.bound:
                    v[c4].append(f"{what}: both ran {both:.3f}s (strict window)")
    return {
        "statuses": statuses,
        "dead_codes": dead_codes,
        "exhausted": exhausted,
        "jobs_in": cfg.jobs,
        "jobs_out": sum(n for st, n in statuses.items() if st in ("succeeded", "dead")),
        "executions": len(executions),
        "duplicate_attempts": duplicate,
        "attempt_outcomes": outcomes,
        "errors": Counter(
            f"{ex.outcome[6:]}: {ex.detail[:110]}"
            for ex in executions
            if ex.outcome and ex.outcome.startswith("error:")
        ),
        "fenced_rows": len(rows),
        "overlaps": overlaps,
        "violations": v,
    }


def run_chaos(config: ChaosConfig, say: Callable[[str], None] = print) -> ChaosReport:
    """Run one chaos configuration and print its summary; does not assert."""
    report = ChaosRun(config, say).run()
    say(report.summary())
    return report


__all__ = [
    "CHECKS",
    "KINDS",
    "ChaosConfig",
    "ChaosReport",
    "ChaosRun",
    "Execution",
    "Fault",
    "check",
    "fingerprint",
    "make_schedule",
    "run_chaos",
]
