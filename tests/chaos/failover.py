"""The failover chaos run: worker processes drain jobs on a real Patroni cluster while a
seeded schedule performs switchovers and hard failovers; then the HA invariants are checked.

``FailoverRun(config).run()``:

1. A :class:`~tests.support.patroni.PatroniCluster` (etcd, two PostgreSQL nodes, or
   ``nodes``), in asynchronous or Patroni's synchronous mode (``strict``:
   ``synchronous_mode_strict``). Everything connects through the libpq multi-host DSN with
   ``target_session_attrs=read-write``.
2. ``workers`` processes of ``leaseq worker tests.chaos.app:app`` (the chaos run's tasks:
   each handler works a little, writes one row to ``chaos_effects`` through
   ``ctx.transaction()``, and logs every execution outside any transaction, the ``E`` line
   with outcome ``committed`` only after that transaction committed). A third of the jobs is
   enqueued before the window; an enqueuer thread adds the rest during the window, and
   records, for every enqueue that *returned*, the job id, the job's ``seq`` (unique in the
   run, in the payload) and when it returned. A worker that exits by itself is restarted
   and counted (none should). ``host_workers`` more run on a host of their own, a network
   namespace (``tests.support.netns``, as root) that reaches each node through a proxy of
   its own (``tests.support.faults.FaultProxy``), with the worker id ``partitioned-host``.
3. The schedule (``make_schedule``, a pure function of the seed and the window): switchovers
   (Patroni's REST API) and hard failovers (``kill -9`` of the primary's Patroni, postmaster
   and backends; the leader key expires, the replica is promoted, the dead node rejoins),
   each waited for until the cluster is healthy again, with seeded pauses between them;
   with ``host_workers``, also *partitions*: once the host's workers hold leases, the
   proxy to the primary stalls (a partition that looks like a hang: nothing is delivered,
   nothing is refused) for ``partition`` seconds, longer than a lease, so the other
   workers' sweepers take the host's jobs over while it still runs them; then it heals
   and whatever the host sent meanwhile arrives late.
4. After the window the run waits until no job is pending or running (or ``drain_timeout``),
   stops the workers (SIGTERM) and checks (``check``).

The summary line: ``failover: jobs=… lost=… stale_success=… double_effects=… duplicates=…
reappeared=… failovers=…`` (then ``lost_enqueues=…``, the mode and the seed):

``jobs``            enqueues that returned an id.
``lost``            of those, jobs not terminal at the end, or missing (no row with that id
                    and that ``seq``) — except in asynchronous mode for an enqueue that
                    returned within ``caveat`` seconds before a hard failover's crash: its
                    own commit can have been lost with the old primary (the documented
                    caveat), and it is counted as ``lost_enqueues`` instead.
``stale_success``   succeeded jobs whose effect row was written under another token than the
                    job's final one, or by an earlier execution under that token than the
                    latest (a token issued twice after a lost claim), or effect rows of
                    jobs that did not succeed.
``double_effects``  jobs with more than one effect row (the effect committed twice).
``duplicates``      executions beyond one per job (retries after lost leases, lost claims,
                    lost completions).
``reappeared``      acknowledged completions (an ``E … committed`` line) that did not stick:
                    the job is not succeeded under that execution's token at the end, or it
                    was executed again after that line.
``failovers``       switchovers plus hard failovers performed.
``partitions``      (with ``host_workers``) partitions performed, ``held`` the leases the
                    host's workers held at the cuts and ``taken_over`` the jobs whose lease
                    expired under the host's owner (the sweepers took them; in partitions
                    and hard failovers alike).

Every execution log line carries the claim's whole ``lease_owner`` (the worker id, the
process's nonce and the claim's number, leaseq.owners), and so does its effect row: a token
issued twice (a claim lost with an asynchronous primary) is told apart even when one
process ran both executions, and the effect must be the latest one's under the final token.

Invariants (a violation makes the run fail): ``lost``, ``stale_success`` and
``double_effects`` are 0 in both modes; ``reappeared`` is 0 in synchronous mode (measured in
asynchronous mode, as are ``duplicates``).
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import random
import shutil
import signal
import tempfile
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

import leaseq
from tests.chaos.app import EFFECTS_TABLE, MAX_ATTEMPTS, effects_ddl
from tests.support.faults import FaultProxy
from tests.support.netns import Host
from tests.support.netns import hosts as netns_hosts
from tests.support.patroni import HOST as HOST_ADDR
from tests.support.patroni import PatroniCluster
from tests.support.procs import WorkerProcess

APP = "tests.chaos.app:app"
SCHEMA = "failover"
OPERATIONS = ("switchover", "hard")
#: The worker id of the workers on the partitioned host (their owners start with it).
HOST_WORKER = "partitioned-host"
#: The host's link-local subnet (tests.support.netns; test_multihost uses 231 and up).
HOST_SUBNET = 221
#: The seconds an operation takes, roughly, for the schedule: a switchover ~5 s, a hard
#: failover ~20 s (ttl + promotion + rejoin); a partition lasts its configured length.
_TAKES = {"switchover": 6.0, "hard": 22.0}


@dataclass(frozen=True)
class FailoverConfig:
    seed: int
    jobs: int = 3000
    seconds: float = 60.0
    synchronous: bool = False
    #: Patroni's synchronous_mode_strict (with ``synchronous``).
    strict: bool = False
    nodes: int = 2
    workers: int = 3
    #: Workers on a host of their own (a network namespace; root only) that the
    #: partitions cut off from the primary.
    host_workers: int = 0
    #: How long a partition lasts (seconds): longer than a lease.
    partition: float = 12.0
    concurrency: int = 8
    lease: float = 4.0
    sweep: float = 1.0
    poll: float = 0.5
    op_timeout: float = 3.0
    #: Seconds between two failover operations (after the cluster is healthy again).
    gap: tuple[float, float] = (3.0, 10.0)
    #: Handler work, uniform in this range (seconds).
    work: tuple[float, float] = (0.02, 0.3)
    #: Before each hard failover the primary's WAL senders are frozen for a time in this
    #: range (seconds), so the crash takes commits the replica never got (async mode).
    lag: tuple[float, float] = (0.2, 1.5)
    #: An async-mode enqueue that returned this close before a crash may be lost with it.
    caveat: float = 10.0
    drain_timeout: float = 120.0
    keep: bool = False
    verbose: bool = False

    def schedule(self) -> tuple[tuple[float, str, float], ...]:
        kinds = (*OPERATIONS, "partition") if self.host_workers else OPERATIONS
        return make_schedule(self.seed, self.seconds, self.gap, self.lag, kinds, self.partition)

    def command(self) -> str:
        mode = "--sync" if self.synchronous else "--async"
        extra = " --strict" if self.strict else ""
        if self.nodes != 2:
            extra += f" --nodes {self.nodes}"
        if self.host_workers:
            extra += f" --host-workers {self.host_workers} --partition {self.partition:g}"
        return (
            f"python -m tests.chaos failover --jobs {self.jobs} --seed {self.seed} "
            f"--seconds {self.seconds:g} {mode}{extra}"
        )


def make_schedule(
    seed: int,
    seconds: float,
    gap: tuple[float, float],
    lag: tuple[float, float] = (0.0, 0.0),
    operations: tuple[str, ...] = OPERATIONS,
    partition: float = 12.0,
) -> tuple[tuple[float, str, float], ...]:
    """(earliest start within the window, operation, replica lag before a hard failover's
    crash): every kind early on in a seeded order, then drawn by weight. Operations block
    until the cluster is healthy, so the real times drift later; an operation whose turn
    comes after the window is left out."""
    rng = random.Random(seed)
    kinds = list(operations)
    rng.shuffle(kinds)
    weights = [{"switchover": 1, "hard": 2}.get(kind, 1) for kind in operations]
    plan: list[tuple[float, str, float]] = []
    t = rng.uniform(*gap)
    while t < seconds:
        kind = kinds.pop(0) if kinds else rng.choices(operations, weights)[0]
        replica_lag = rng.uniform(*lag) if kind == "hard" else 0.0
        plan.append((round(t, 2), kind, round(replica_lag, 2)))
        t += _TAKES.get(kind, partition + 2.0) + rng.uniform(*gap)
    return tuple(plan)


@dataclass
class Enqueued:
    job_id: int
    seq: int
    returned: float  # time.time() when enqueue returned


@dataclass
class Exec:
    job: int
    token: int
    pid: int
    start: float
    end: float | None = None
    outcome: str | None = None
    #: The claim's lease_owner (unique per claim, even within one process).
    owner: str = ""


@dataclass
class FailoverReport:
    config: FailoverConfig
    jobs: int
    lost: list[str]
    lost_enqueues: list[str]
    stale_success: list[str]
    double_effects: list[str]
    duplicates: int
    reappeared: list[str]
    switchovers: int
    hard: int
    workers_restarted: int
    statuses: Counter[str]
    enqueue_errors: int
    executions: int
    run_dir: pathlib.Path | None = None
    notes: list[str] = field(default_factory=list)
    partitions: int = 0
    #: Leases the partitioned host's workers held at the cuts, and the jobs whose lease
    #: expired under the host's owner (taken over by the others; also in hard failovers).
    held: int = 0
    taken_over: int = 0

    @property
    def violations(self) -> dict[str, list[str]]:
        found = {
            "lost": self.lost,
            "stale_success": self.stale_success,
            "double_effects": self.double_effects,
        }
        if self.config.synchronous:
            found["reappeared"] = self.reappeared
        return found

    @property
    def ok(self) -> bool:
        return not any(self.violations.values())

    def line(self) -> str:
        mode = "sync" if self.config.synchronous else "async"
        return (
            f"failover: jobs={self.jobs} lost={len(self.lost)} "
            f"stale_success={len(self.stale_success)} "
            f"double_effects={len(self.double_effects)} duplicates={self.duplicates} "
            f"reappeared={len(self.reappeared)} failovers={self.switchovers + self.hard} "
            f"lost_enqueues={len(self.lost_enqueues)} mode={mode} seed={self.config.seed}"
            + (
                f" partitions={self.partitions} held={self.held} taken_over={self.taken_over}"
                if self.config.host_workers
                else ""
            )
            + (" strict" if self.config.strict else "")
            + (f" nodes={self.config.nodes}" if self.config.nodes != 2 else "")
        )

    def details(self) -> str:
        out = [
            f"  switchovers {self.switchovers}, hard failovers {self.hard}, executions "
            f"{self.executions}, statuses {dict(self.statuses)}, enqueue errors "
            f"{self.enqueue_errors}, workers restarted {self.workers_restarted}",
        ]
        for name, items in [*self.violations.items(), ("lost_enqueues", self.lost_enqueues)]:
            for item in items[:10]:
                out.append(f"  {name}: {item}")
        if not self.config.synchronous:
            for item in self.reappeared[:5]:
                out.append(f"  reappeared (async, measured): {item}")
        if self.run_dir is not None:
            out.append(f"  run directory kept: {self.run_dir}")
        return "\n".join(out + [f"  {n}" for n in self.notes])


class FailoverRun:
    def __init__(self, config: FailoverConfig, say: Callable[[str], None] = print) -> None:
        self.cfg = config
        self.say = say
        self.enqueued: list[Enqueued] = []
        self.enqueue_errors = 0
        self.crashes: list[float] = []  # time.time() of each hard failover's kill -9
        self.switchovers = 0
        self.workers: list[WorkerProcess] = []
        self.on_host: set[WorkerProcess] = set()  # those on the partitioned host
        self.host: Host | None = None
        self.proxies: dict[str, FaultProxy] = {}  # node -> the host's way to it
        self.partitions = 0
        self.held = 0
        self.restarted = 0
        self.notes: list[str] = []
        self._stop = threading.Event()
        self._seq = 0

    def run(self) -> FailoverReport:
        cfg = self.cfg
        parent = (
            pathlib.Path("/var/tmp") if os.geteuid() == 0 else pathlib.Path(tempfile.gettempdir())
        )
        base = parent / f"leaseq-failover-{cfg.seed}-{uuid.uuid4().hex[:6]}"
        self.exec_dir = base / "exec"
        self.exec_dir.mkdir(parents=True)
        report: FailoverReport | None = None
        cluster = PatroniCluster(synchronous=cfg.synchronous, strict=cfg.strict, nodes=cfg.nodes)
        with contextlib.ExitStack() as stack:
            if cfg.host_workers:
                (self.host,) = stack.enter_context(netns_hosts(1, subnet=HOST_SUBNET))
            try:
                report = self._run(cluster, base)
            finally:
                for worker in self.workers:
                    worker.kill()
                for proxy in self.proxies.values():
                    proxy.stop()
                cluster.keep = report is None or not report.ok or cfg.keep
                cluster.close()
                if report is not None and report.ok and not cfg.keep:
                    shutil.rmtree(base, ignore_errors=True)
                elif report is not None:
                    report.run_dir = base
        assert report is not None
        return report

    def _run(self, cluster: PatroniCluster, base: pathlib.Path) -> FailoverReport:
        cfg = self.cfg
        self.cluster = cluster.start()
        self.dsn = cluster.multi_host_dsn()
        with leaseq.Client(self.dsn, schema=SCHEMA) as client:
            client.migrate()
            with client.connection() as conn:
                conn.execute(effects_ddl(SCHEMA))
            self._enqueue_batch(client, cfg.jobs // 3)
        if self.host is not None:
            self._open_proxies()
        for _ in range(cfg.workers):
            self._spawn(base)
        for _ in range(cfg.host_workers):
            self._spawn(base, on_host=True)
        self._wait_workers_listening()
        feeder = threading.Thread(target=self._feed, name="enqueuer", daemon=True)
        feeder.start()
        try:
            self._chaos(base)
        finally:
            self._stop.set()
            feeder.join(60)
        cluster.wait_healthy()
        self._drain(base)
        self._stop_workers()
        return self._analyze()

    # -- load ------------------------------------------------------------------------------

    def _payloads(self, count: int) -> list[leaseq.JobSpec]:
        rng = random.Random(f"{self.cfg.seed}:{self._seq}")
        specs = []
        for _ in range(count):
            work = rng.uniform(*self.cfg.work)
            steps = max(1, round(work / 0.05))
            payload = {
                "seq": self._seq,
                "n": steps,
                "s": round(work / steps, 4),
                "mode": "ok",
                "out": str(self.exec_dir),
            }
            self._seq += 1
            task = "chaos.sync" if rng.random() < 0.5 else "chaos.async"
            specs.append(leaseq.JobSpec(task, payload, max_attempts=MAX_ATTEMPTS))
        return specs

    def _enqueue_batch(self, client: leaseq.Client, count: int) -> None:
        specs = self._payloads(count)
        for i in range(0, len(specs), 500):
            chunk = specs[i : i + 500]
            ids = client.enqueue_many(chunk)
            now = time.time()
            for spec, job_id in zip(chunk, ids, strict=True):
                self.enqueued.append(Enqueued(int(job_id), int(spec.payload["seq"]), now))

    def _feed(self) -> None:
        """Enqueue the remaining jobs evenly over the window, 10 at a time; an enqueue that
        raised is not counted (its outcome is unknown to the caller) and not retried."""
        left = self.cfg.jobs - len(self.enqueued)
        batches = max(1, left // 10)
        pause = self.cfg.seconds * 0.9 / batches
        client = leaseq.Client(self.dsn, schema=SCHEMA, application_name="failover-enqueuer")
        try:
            while left > 0 and not self._stop.is_set():
                count = min(10, left)
                specs = self._payloads(count)
                try:
                    ids = client.enqueue_many(specs)
                except (psycopg.Error, leaseq.LeaseqError, OSError):
                    self.enqueue_errors += count
                    with contextlib.suppress(Exception):
                        client.check_connections()
                else:
                    now = time.time()
                    for spec, job_id in zip(specs, ids, strict=True):
                        self.enqueued.append(Enqueued(int(job_id), int(spec.payload["seq"]), now))
                left -= count
                self._stop.wait(pause)
        finally:
            client.close()

    # -- workers ---------------------------------------------------------------------------

    def _open_proxies(self) -> None:
        """The host's way to each node: a proxy on its gateway address."""
        assert self.host is not None
        for name in self.cluster.nodes:
            proxy = FaultProxy(
                HOST_ADDR, self.cluster.pg_ports[name], listen_host=self.host.gateway
            )
            proxy.start()
            self.proxies[name] = proxy

    def _host_dsn(self) -> str:
        """The multi-host DSN as the host sees the cluster: every node through its proxy."""
        assert self.host is not None
        params = conninfo_to_dict(self.dsn)
        names = self.cluster.nodes
        params["host"] = ",".join(self.host.gateway for _ in names)
        params["port"] = ",".join(str(self.proxies[name].port) for name in names)
        return make_conninfo("", **params)

    def _spawn(self, base: pathlib.Path, *, on_host: bool = False) -> None:
        cfg = self.cfg
        args = (
            "--concurrency", str(cfg.concurrency),
            "--lease-seconds", str(cfg.lease),
            "--sweep-interval", str(cfg.sweep),
            "--poll-interval", str(cfg.poll),
            "--op-timeout", str(cfg.op_timeout),
            "--shutdown-timeout", "15",
        )  # fmt: skip
        logs = base / "logs"
        if not on_host:
            self.workers.append(WorkerProcess(self.dsn, SCHEMA, *args, log_dir=logs, app=APP))
            return
        assert self.host is not None
        n = sum(1 for _ in self.on_host) + self.restarted
        worker = WorkerProcess(
            self._host_dsn(),
            SCHEMA,
            *args,
            "--worker-id",
            f"{HOST_WORKER}-{n}",
            log_dir=logs,
            app=APP,
            wrapper=self.host.wrapper,
        )
        self.workers.append(worker)
        self.on_host.add(worker)

    def _wait_workers_listening(self, timeout: float = 60.0) -> None:
        """Until every worker has its LISTEN connection: a worker that cannot connect at
        start exits (a bad DSN fails fast), so the chaos starts only once all are up."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with (
                contextlib.suppress(psycopg.Error),
                psycopg.connect(self.dsn, autocommit=True) as conn,
            ):
                row = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity "
                    "WHERE application_name = 'leaseq-listener'"
                ).fetchone()
                if row is not None and row[0] >= self.cfg.workers + self.cfg.host_workers:
                    return
            time.sleep(0.2)
        self.notes.append(f"workers not all listening after {timeout:.0f}s")

    def _watch(self, base: pathlib.Path) -> None:
        for worker in list(self.workers):
            code = worker.proc.poll()
            if code is not None:
                self.workers.remove(worker)
                tail = " | ".join(worker.output().strip().splitlines()[-2:])
                self.notes.append(f"worker {worker.pid} exited {code} by itself: {tail[-200:]}")
                worker.kill()
                self.restarted += 1
                on_host = worker in self.on_host
                self.on_host.discard(worker)
                self._spawn(base, on_host=on_host)

    # -- the schedule ----------------------------------------------------------------------

    def _note(self, text: str) -> None:
        if self.cfg.verbose:
            self.say(f"{time.strftime('%H:%M:%S')} {text}")

    def _chaos(self, base: pathlib.Path) -> None:
        start = time.monotonic()
        for at, kind, replica_lag in self.cfg.schedule():
            while time.monotonic() < start + at:
                self._watch(base)
                time.sleep(0.1)
            if time.monotonic() > start + self.cfg.seconds:
                break
            began = time.monotonic()
            if kind == "switchover":
                old, new = self.cluster.switchover()
                self.switchovers += 1
            elif kind == "partition":
                old = new = self._partition()
            else:
                old = self.cluster.crash_leader(replica_lag)
                self.crashes.append(time.time())
                new = self.cluster.wait_leader()
                self.cluster.restart_node(old)
                self.cluster.wait_healthy()
            lagged = f" (replica {replica_lag:.2f}s behind)" if kind == "hard" else ""
            self._note(f"{kind}{lagged} {old} -> {new} in {time.monotonic() - began:.1f}s")
            self._watch(base)
        while time.monotonic() < start + self.cfg.seconds:
            self._watch(base)
            time.sleep(0.1)

    def _host_leases(self) -> int:
        with contextlib.suppress(psycopg.Error):
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                row = conn.execute(
                    sql.SQL(
                        "SELECT count(*) FROM {}.jobs WHERE status = 'running'"
                        " AND lease_owner LIKE %s"
                    ).format(sql.Identifier(SCHEMA)),
                    (f"{HOST_WORKER}-%",),
                ).fetchone()
            return int(row[0]) if row else 0
        return 0

    def _partition(self) -> str:
        """Cut the host off from the primary once it holds leases (up to 10 s of waiting),
        for ``partition`` seconds; returns the primary's name."""
        leader = self.cluster.wait_healthy()
        deadline = time.monotonic() + 10
        held = self._host_leases()
        while held == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
            held = self._host_leases()
        proxy = self.proxies[leader]
        proxy.stall()
        self.held += self._host_leases() if held else 0
        self.partitions += 1
        self._note(f"partition: host cut off from {leader} holding {held} lease(s)")
        time.sleep(self.cfg.partition)
        proxy.resume()
        return leader

    def _drain(self, base: pathlib.Path) -> None:
        deadline = time.monotonic() + self.cfg.drain_timeout
        left = -1
        while time.monotonic() < deadline:
            self._watch(base)
            with contextlib.suppress(psycopg.Error):
                with psycopg.connect(self.dsn, autocommit=True) as conn:
                    row = conn.execute(
                        sql.SQL(
                            "SELECT count(*) FROM {}.jobs WHERE status IN ('pending', 'running')"
                        ).format(sql.Identifier(SCHEMA))
                    ).fetchone()
                left = int(row[0]) if row else -1
            if left == 0:
                return
            time.sleep(0.5)
        self.notes.append(f"drain timed out with {left} job(s) not terminal")

    def _stop_workers(self) -> None:
        for worker in self.workers:
            worker.signal(signal.SIGTERM)
        for worker in self.workers:
            try:
                worker.wait(40)
            except Exception:
                self.notes.append(f"worker {worker.pid} did not stop within 40 s")

    # -- the checks ------------------------------------------------------------------------

    def _analyze(self) -> FailoverReport:
        s = sql.Identifier(SCHEMA)
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            jobs = conn.execute(
                sql.SQL(
                    "SELECT id, status::text, lease_token, (payload->>'seq')::int FROM {}.jobs"
                ).format(s)
            ).fetchall()
            rows = conn.execute(
                sql.SQL("SELECT job_id, token, worker, exec_start FROM {}.{}").format(
                    s, sql.Identifier(EFFECTS_TABLE)
                )
            ).fetchall()
            # The host's jobs that the sweepers took over: their lease expired under an
            # owner of the host (the sweep names it).
            taken = conn.execute(
                sql.SQL(
                    "SELECT count(DISTINCT job_id) FROM {}.job_events"
                    " WHERE event = 'lease_expired' AND detail LIKE %s"
                ).format(s),
                (f"%lease of {HOST_WORKER}-%",),
            ).fetchone()
        result = check(self.cfg, jobs, rows, read_execs(self.exec_dir), self.enqueued, self.crashes)
        return FailoverReport(
            partitions=self.partitions,
            held=self.held,
            taken_over=int(taken[0]) if taken else 0,
            config=self.cfg,
            switchovers=self.switchovers,
            hard=len(self.crashes),
            workers_restarted=self.restarted,
            enqueue_errors=self.enqueue_errors,
            notes=self.notes,
            **result,
        )


def read_execs(directory: pathlib.Path) -> list[Exec]:
    """Executions from the chaos app's logs, one per (job, token, owner): a token can
    repeat after a lost claim, even in one process, but an owner names one claim."""
    found: dict[tuple[int, int, str], Exec] = {}
    for path in sorted(directory.glob("exec-*.log")):
        for line in path.read_text().splitlines():
            parts = line.split("\t")
            if len(parts) < 6 or parts[0] == "T":
                continue
            job, token, pid, owner = int(parts[1]), int(parts[2]), int(parts[3]), parts[4]
            ex = found.setdefault(
                (job, token, owner), Exec(job, token, pid, float(parts[5]), owner=owner)
            )
            if parts[0] == "E" and len(parts) >= 9:
                ex.end, ex.outcome = float(parts[7]), parts[8]
    return list(found.values())


def check(
    cfg: FailoverConfig,
    jobs: list[tuple[Any, ...]],
    rows: list[tuple[Any, ...]],
    execs: list[Exec],
    enqueued: list[Enqueued],
    crashes: list[float],
) -> dict[str, Any]:
    """The invariants (see the module docstring), on what the database and the logs say."""
    by_id = {int(r[0]): (str(r[1]), int(r[2]), r[3]) for r in jobs}
    effects: dict[int, list[int]] = defaultdict(list)
    writers: dict[int, list[str]] = defaultdict(list)
    for job_id, token, owner, _exec_start in rows:
        effects[int(job_id)].append(int(token))
        writers[int(job_id)].append(str(owner))
    runs: dict[int, list[Exec]] = defaultdict(list)
    for ex in execs:
        runs[ex.job].append(ex)

    lost: list[str] = []
    lost_enqueues: list[str] = []
    for e in enqueued:
        found = by_id.get(e.job_id)
        if found is None or found[2] != e.seq:
            near_crash = any(0 <= crash - e.returned <= cfg.caveat for crash in crashes)
            what = f"job {e.job_id} (seq {e.seq}) is gone" + (
                f" (id now holds seq {found[2]})" if found else ""
            )
            if not cfg.synchronous and near_crash:
                lost_enqueues.append(what)
            else:
                lost.append(what)
        elif found[0] not in ("succeeded", "dead"):
            lost.append(f"job {e.job_id} (seq {e.seq}) is {found[0]} at the end")

    stale: list[str] = []
    double: list[str] = []
    for job_id, tokens in effects.items():
        status, final, _seq = by_id.get(job_id, ("missing", -1, None))
        if len(tokens) > 1:
            double.append(f"job {job_id}: {len(tokens)} effect rows, tokens {sorted(tokens)}")
        if status != "succeeded":
            stale.append(f"job {job_id} is {status} but has effect rows (tokens {tokens})")
        elif any(t != final for t in tokens):
            stale.append(f"job {job_id}: effect under token {tokens}, final token {final}")
        else:
            # A lost claim lets the final token be issued twice, even to one process; the
            # owner (one per claim) tells the executions apart: the effect must be the
            # latest execution's under the final token, not the stale one's.
            under = [ex for ex in runs.get(job_id, []) if ex.token == final]
            if under:
                last = max(under, key=lambda ex: ex.start)
                for owner in writers[job_id]:
                    if owner != last.owner:
                        stale.append(
                            f"job {job_id}: effect by claim {owner}, not by the latest one "
                            f"under token {final} ({last.owner}, pid {last.pid})"
                        )

    reappeared: list[str] = []
    duplicates = 0
    for job_id, job_runs in runs.items():
        duplicates += len(job_runs) - 1
        status, final, _seq = by_id.get(job_id, ("missing", -1, None))
        for ex in job_runs:
            if ex.outcome != "committed" or ex.end is None:
                continue
            after = [o for o in job_runs if o is not ex and o.start > ex.end]
            if status != "succeeded" or ex.token != final or after:
                reappeared.append(
                    f"job {job_id}: completion under token {ex.token} acknowledged, job now "
                    f"{status} at token {final}, {len(after)} execution(s) after"
                )
                break
    statuses = Counter(str(r[1]) for r in jobs)
    return {
        "jobs": len(enqueued),
        "lost": lost,
        "lost_enqueues": lost_enqueues,
        "stale_success": stale,
        "double_effects": double,
        "duplicates": duplicates,
        "reappeared": reappeared,
        "statuses": statuses,
        "executions": len(execs),
    }


def run_failover(config: FailoverConfig, say: Callable[[str], None] = print) -> FailoverReport:
    """Run one configuration; prints the summary line (and details); does not assert."""
    say(f"failover run: {config.command()} schedule={list(config.schedule())}")
    report = FailoverRun(config, say).run()
    say(report.line())
    say(report.details())
    return report


__all__ = [
    "Enqueued",
    "Exec",
    "FailoverConfig",
    "FailoverReport",
    "FailoverRun",
    "check",
    "make_schedule",
    "read_execs",
    "run_failover",
]
