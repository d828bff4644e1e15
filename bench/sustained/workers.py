"""The worker subprocesses of the sustained run: starting them (each with a metrics port
of its own), waiting until they are ready, stopping them, scraping their /metrics, and
reading their resident memory (psutil)."""

from __future__ import annotations

import contextlib
import pathlib
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import psutil
from prometheus_client.parser import text_string_to_metric_families

from bench.harness import REPO_ROOT, BenchError, worker_command, worker_env
from bench.sustained.model import Options, Scrape

READY_TIMEOUT = 60.0  # longest wait for a new worker's /readyz
STOP_TIMEOUT = 60.0  # longest wait for a worker after SIGTERM (its --shutdown-timeout is 30)
SCRAPE_TIMEOUT = 5.0
FINISHED = "leaseq_jobs_finished_total"
CLAIM_BUCKET = "leaseq_claim_statement_seconds_bucket"


class WorkerDied(BenchError):
    """A worker process exited while the run needed it."""


@dataclass
class Worker:
    """One ``leaseq worker`` subprocess, its metrics port and the file it logs to."""

    proc: subprocess.Popen[bytes]
    port: int
    log_path: pathlib.Path
    exit_code: int | None = None

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def check_alive(self) -> None:
        code = self.proc.poll()
        if code is not None:
            raise WorkerDied(f"worker {self.proc.pid} exited with {code}: {self.last_words()}")

    def last_words(self) -> str:
        """The last line the worker wrote: why it stopped, on one line."""
        try:
            lines = self.log_path.read_text(errors="replace").strip().splitlines()
        except OSError:
            return "(no log)"
        return lines[-1].strip() if lines else "(no output)"


def free_ports(count: int) -> list[int]:
    """Ports nothing listens on now: all are held open together so they differ."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(count)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in socks]


def start_worker(opts: Options, schema: str, port: int, log_dir: str) -> Worker:
    """A long-running (not --burst) worker serving /metrics on ``port``. It gets a process
    group of its own, so a Ctrl-C in the terminal reaches only this process, which then
    stops the worker with one SIGTERM (a second signal would make it abandon its jobs)."""
    command = worker_command(
        "--concurrency",
        str(opts.concurrency),
        "--batch-size",
        str(opts.batch),
        "--retention",
        opts.retention,
        "--prune-interval",
        opts.prune_interval,
        "--metrics-port",
        str(port),
    )
    log_path = pathlib.Path(log_dir) / f"worker-{port}.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            command,
            cwd=REPO_ROOT,
            env=worker_env(opts.dsn, schema),
            stdout=log,
            stderr=subprocess.STDOUT,
            process_group=0,
        )
    return Worker(proc, port, log_path)


def wait_ready(worker: Worker) -> None:
    """Until the worker's /readyz answers 200 (it is up and reaches the database)."""
    deadline = time.monotonic() + READY_TIMEOUT
    while time.monotonic() < deadline:
        worker.check_alive()
        try:
            with urllib.request.urlopen(worker.url("/readyz"), timeout=SCRAPE_TIMEOUT) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.2)
    raise BenchError(f"worker {worker.proc.pid} was not ready within {READY_TIMEOUT:g} s")


def stop_workers(workers: Sequence[Worker]) -> None:
    """SIGTERM (a graceful stop), then wait; a worker still there after STOP_TIMEOUT, or
    when waiting is interrupted, is killed, so none outlives the run."""
    try:
        for w in workers:
            if w.proc.poll() is None:
                w.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT
        for w in workers:
            with contextlib.suppress(subprocess.TimeoutExpired):
                w.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
    finally:
        for w in workers:
            if w.proc.poll() is None:
                print(
                    f"sustained: worker {w.proc.pid} still running after SIGTERM, killed; "
                    f"its last output: {w.last_words()}",
                    file=sys.stderr,
                )
                w.proc.kill()
            w.exit_code = w.proc.wait()


@contextlib.contextmanager
def running_workers(
    opts: Options, schema: str, log_dir: str, workers: list[Worker]
) -> Iterator[list[Worker]]:
    """``--workers`` ready worker processes, each on a metrics port of its own, appended
    to ``workers`` (so their exit codes outlive the block); stopped on the way out, also
    when starting one of them failed."""
    try:
        for port in free_ports(opts.workers):
            workers.append(start_worker(opts, schema, port, log_dir))
        for w in workers:
            wait_ready(w)
        yield workers
    finally:
        stop_workers(workers)


def scrape(worker: Worker) -> Scrape:
    """The worker's finished-jobs counter and claim-statement histogram from /metrics:
    exact counts, kept by the worker, so sampling costs the database nothing."""
    try:
        with urllib.request.urlopen(worker.url("/metrics"), timeout=SCRAPE_TIMEOUT) as resp:
            text = resp.read().decode()
    except (urllib.error.URLError, OSError) as exc:
        worker.check_alive()
        raise BenchError(f"cannot scrape worker {worker.proc.pid}'s metrics: {exc}") from None
    finished = 0.0
    buckets: dict[float, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == FINISHED:
                finished += sample.value
            elif sample.name == CLAIM_BUCKET:
                bound = float(sample.labels["le"])
                buckets[bound] = buckets.get(bound, 0.0) + sample.value
    return Scrape(finished, tuple(sorted(buckets.items())))


def rss_bytes(pid: int) -> int:
    """Resident memory of ``pid`` (0 where there is no such process any more)."""
    try:
        return int(psutil.Process(pid).memory_info().rss)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return 0
