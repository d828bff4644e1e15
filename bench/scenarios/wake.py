"""The ``wake-latency`` scenario: enqueue -> handler start on an idle queue, through a
real ``leaseq worker`` subprocess, with LISTEN/NOTIFY and polling only; also the worker's
claim statements per job, and the ratio polling / NOTIFY."""

from __future__ import annotations

import pathlib
import random
import signal
import socket
import subprocess
import tempfile
import time

from bench.db import connect, fresh_schema
from bench.harness import (
    QUEUE,
    REPO_ROOT,
    STAMP_TASK,
    BenchError,
    Metric,
    Ratio,
    Sample,
    Scenario,
    Settings,
    ms,
    percentile,
    worker_command,
    worker_env,
)

NAME = "wake-latency"
WAKE_GAP = 0.020  # least seconds between a wake-latency job's start and the next enqueue
WAKE_POLL = 0.05  # --poll-interval of the polling-only wake-latency worker
WAKE_NOTIFY_POLL = 5.0  # --poll-interval of the NOTIFY wake-latency worker
WAKE_WARMUP = 3  # jobs run (and not counted) before the timed ones
WAKE_TIMEOUT = 15.0  # longest wait for one handler to start


def wait_for_listener(dsn: str, channel: str, proc: subprocess.Popen[bytes]) -> None:
    """Until the worker's LISTEN connection is up: a job enqueued before that would only
    be found by the poll, and measure the poll instead of the wake-up."""
    deadline = time.monotonic() + 30
    with connect(dsn) as conn:
        while time.monotonic() < deadline:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE application_name = 'leaseq-listener' AND query LIKE %s",
                ("LISTEN %" + channel + "%",),
            ).fetchone()
            if row is not None and row[0]:
                return
            if proc.poll() is not None:
                return  # the caller reports the exit
            time.sleep(0.05)
    raise BenchError("the wake-latency worker did not LISTEN within 30 s")


def await_start(sock: socket.socket, index: int, proc: subprocess.Popen[bytes]) -> None:
    """Until the handler of job ``index`` has signalled that it started."""
    deadline = time.monotonic() + WAKE_TIMEOUT
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise BenchError(f"job {index} did not start within {WAKE_TIMEOUT:g} s")
        if proc.poll() is not None:
            raise BenchError(f"the wake-latency worker exited with {proc.returncode}")
        sock.settimeout(min(left, 1.0))
        try:
            data = sock.recv(64)
        except TimeoutError:
            continue
        if data == str(index).encode():
            return


def claim_index_scans(dsn: str, schema: str) -> int:
    """Index scans of jobs_claimable_idx so far: one per claim_jobs statement. Read after
    the worker exited (its backends flush their statistics when they disconnect), and
    re-read until it stops changing, since that flush is asynchronous to the exit."""
    query = (
        "SELECT coalesce(sum(idx_scan), 0) FROM pg_stat_user_indexes "
        "WHERE schemaname = %s AND indexrelname = 'jobs_claimable_idx'"
    )
    last = -1
    deadline = time.monotonic() + 5
    with connect(dsn) as conn:
        while True:
            row = conn.execute(query, (schema,)).fetchone()
            now = int(row[0]) if row is not None else 0
            if now == last or time.monotonic() > deadline:
                return now
            last = now
            time.sleep(0.3)


def wake_latencies(settings: Settings, listen: bool) -> tuple[list[float], int]:
    """Seconds from the return of ``Client.enqueue`` (committed) to the handler's start,
    for each of the timed jobs, each enqueued on an idle queue; and how many claim_jobs
    statements the worker sent over its whole life (warm-up included)."""
    options = (
        ("--poll-interval", f"{WAKE_NOTIFY_POLL:g}")
        if listen
        else ("--no-listen", "--poll-interval", f"{WAKE_POLL:g}")
    )
    with (
        fresh_schema(settings.dsn, NAME) as client,
        tempfile.TemporaryDirectory(prefix="leaseq-bench-") as tmp,
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock,
    ):
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
        stamps = pathlib.Path(tmp) / "started"
        log_path = pathlib.Path(tmp) / "worker.log"
        enqueued: dict[int, float] = {}
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                worker_command(*options),
                cwd=REPO_ROOT,
                env=worker_env(settings.dsn, client.schema),
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        try:
            if listen:
                wait_for_listener(settings.dsn, client.channel, proc)
            for index in range(-WAKE_WARMUP, settings.wake_jobs):
                payload = {"i": index, "file": str(stamps), "port": port}
                client.enqueue(STAMP_TASK, payload, queue=QUEUE)
                enqueued[index] = time.time()
                await_start(sock, index, proc)
                # A random part spanning one poll interval: arrivals land at random points
                # of the worker's poll cycle. (A fixed gap would lock onto that cycle, since
                # a finished job also wakes the worker's fetch loop and restarts its timer.)
                time.sleep(WAKE_GAP + random.uniform(0, WAKE_POLL))
        except BenchError as exc:
            raise BenchError(f"{exc}; worker output: {log_path.read_text()[-2000:]!r}") from None
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        started: dict[int, float] = {}
        for line in stamps.read_text().splitlines():
            index_text, at = line.split()
            started[int(index_text)] = float(at)
        claims = claim_index_scans(settings.dsn, client.schema)
    missing = [i for i in range(settings.wake_jobs) if i not in started]
    if missing:
        raise BenchError(f"wake-latency: {len(missing)} job(s) left no start time")
    return [started[i] - enqueued[i] for i in range(settings.wake_jobs)], claims


def wake_latency(settings: Settings) -> dict[str, Sample]:
    """A `leaseq worker` subprocess waiting on an idle queue; jobs enqueued one at a time.
    Once with LISTEN/NOTIFY (a slow poll behind it), once polling only."""
    out: dict[str, Sample] = {}
    for tag, listen in (("notify", True), ("poll", False)):
        latencies, claims = wake_latencies(settings, listen)
        total = sum(latencies)
        for pct in (50, 95, 99):
            out[f"wake-{tag}-p{pct}"] = Sample(
                len(latencies), total, ms(percentile(latencies, pct))
            )
        jobs = len(latencies) + WAKE_WARMUP
        out[f"wake-{tag}-claims"] = Sample(jobs, total, claims / jobs)
    return out


SCENARIO = Scenario(
    NAME,
    "enqueue -> handler start on an idle queue, `leaseq worker` with NOTIFY and polling only",
    tuple(
        Metric(f"wake-{tag}-{what}", NAME, f"{text}, {label}", unit)
        for tag, text in (
            ("notify", f"NOTIFY, --poll-interval {WAKE_NOTIFY_POLL:g}"),
            ("poll", f"--no-listen --poll-interval {WAKE_POLL:g}"),
        )
        for what, label, unit in (
            ("p50", "p50", "ms"),
            ("p95", "p95", "ms"),
            ("p99", "p99", "ms"),
            ("claims", "worker claim statements per job", "claims/job"),
        )
    ),
    wake_latency,
)

RATIOS = (Ratio("wake-up p50, polling only / NOTIFY", "wake-poll-p50", "wake-notify-p50"),)
