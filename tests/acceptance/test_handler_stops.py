"""The real stop of sync handlers, with real worker processes (leaseq.worker.stops).

A sync handler past ``max_runtime`` gets an exception raised in its thread (the soft stop)
and its job is retried only once that thread has really ended: the handler's start/end
marks never overlap. One that swallows the exception is hard-stopped: its worker process
exits with code 4, the supervisor starts a new one, and the job is retried after its
lease expires, never while the old handler still runs.
"""

from __future__ import annotations

import pathlib
import re
import signal
import urllib.request

import pytest

import leaseq
from leaseq import JobStatus
from tests.support.procs import WorkerProcess, alive, wait_for

pytestmark = pytest.mark.slow  # real worker processes, one of them made to exit

APP = "tests.support.apps.stops:app"


def _marks(path: pathlib.Path) -> list[tuple[str, int, int]]:
    """(what, attempt, pid) per line, in the order the lines were written."""
    if not path.exists():
        return []
    found = []
    for line in path.read_text().splitlines():
        what, attempt, pid, _ = line.split()
        found.append((what, int(attempt), int(pid)))
    return found


def _job(client: leaseq.Client, job_id: int) -> leaseq.Job:
    job = client.get_job(job_id)
    assert job is not None
    return job


@pytest.mark.parametrize(
    ("lease", "cleanup"), [("5", 0.0), ("1", 2.0)], ids=["prompt", "cleanup-past-the-lease"]
)
def test_a_sync_handler_past_max_runtime_runs_at_most_once_at_a_time(
    dsn: str,
    schema: str,
    client: leaseq.Client,
    tmp_path: pathlib.Path,
    lease: str,
    cleanup: float,
) -> None:
    """30 s of work per attempt, max_runtime 1 s: without a real stop every retry would
    start while the attempts before it still run. With a clean-up twice the lease, the
    lease must be renewed after the stop, or the sweepers hand the job to the other
    worker while the first still cleans up."""
    marker = tmp_path / "marks"
    payload = {"marker": str(marker), "seconds": 30, "cleanup": cleanup}
    job_id = client.enqueue("overrun", payload, max_attempts=3)
    args = (
        "--lease-seconds", lease, "--poll-interval", "0.05", "--sweep-interval", "0.2",
        "-c", "2", "--metrics-port", "0",
    )  # fmt: skip
    with (
        WorkerProcess(dsn, schema, *args, log_dir=tmp_path, app=APP) as a,
        WorkerProcess(dsn, schema, *args, log_dir=tmp_path, app=APP) as b,
    ):
        wait_for(lambda: _job(client, job_id).status == JobStatus.DEAD, 60, "the job to die")
        marks = _marks(marker)
        # Every attempt started after the one before it had ended, and ran nowhere else.
        running: int | None = None
        starts = []
        for what, attempt, _pid in marks:
            if what == "start":
                assert running is None, f"attempt {attempt} started while {running} ran: {marks}"
                running = attempt
                starts.append(attempt)
            else:
                assert running == attempt, f"{what} of attempt {attempt} outside it: {marks}"
                if what == "end":
                    running = None
        assert running is None and starts == [1, 2, 3], marks
        job = _job(client, job_id)
        assert (job.attempt_count, job.last_error_code) == (3, "MAX_RUNTIME_EXCEEDED")
        logs = a.output() + b.output()
        assert logs.count("soft stop: HandlerStopped raised in its handler thread") == 3, logs
        assert logs.count("its handler thread ended") == 3, logs
        assert "hard stop" not in logs.replace("(hard stop in", "")
        # The metric says so too, on the workers that stopped a handler.
        soft = 0.0
        for worker in (a, b):
            (port,) = re.findall(r"metrics on http://127\.0\.0\.1:(\d+)/metrics", worker.output())
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
                text = r.read().decode()
            found = re.findall(r'^leaseq_handler_stops_total\{kind="soft"\} (\S+)$', text, re.M)
            soft += float(found[0]) if found else 0.0
            assert not re.search(r'^leaseq_handler_stops_total\{kind="hard"\} [1-9]', text, re.M)
        assert soft == 3
        for worker in (a, b):
            worker.signal(signal.SIGTERM)
            assert worker.wait(30) == 0, worker.output()


def test_a_handler_that_swallows_the_soft_stop_is_hard_stopped_and_replaced(
    dsn: str, schema: str, client: leaseq.Client, tmp_path: pathlib.Path
) -> None:
    marker = tmp_path / "marks"
    job_id = client.enqueue("stubborn", {"marker": str(marker)}, max_attempts=3)
    args = (
        "-p", "2", "--stop-grace", "1", "--lease-seconds", "3",
        "--poll-interval", "0.05", "--sweep-interval", "0.5",
    )  # fmt: skip
    with WorkerProcess(dsn, schema, *args, log_dir=tmp_path, app=APP) as supervisor:
        wait_for(
            lambda: _job(client, job_id).status == JobStatus.SUCCEEDED, 60, "the job to succeed"
        )
        marks = _marks(marker)
        first = [pid for what, attempt, pid in marks if attempt == 1]
        (stuck,) = set(first)
        assert ("swallowed", 1, stuck) in marks, "the soft stop was raised (and swallowed)"
        # The stuck handler wrote nothing once the second attempt had started: it was gone.
        second = marks.index(next(m for m in marks if m[:2] == ("start", 2)))
        assert all(attempt == 2 for _, attempt, _ in marks[second:]), marks
        assert marks[second][2] != stuck and not alive(stuck)
        job = _job(client, job_id)
        assert (job.attempt_count, job.status) == (2, JobStatus.SUCCEEDED)
        out = supervisor.output()
        assert "hard stop: the worker process exits with code 4" in out, out
        assert re.search(rf"\(pid {stuck}\) exited with code 4 \(hard stop", out), out
        # The supervisor replaced it: three worker processes started in all.
        wait_for(
            lambda: supervisor.output().count("worker serving postgresql://") >= 3,
            30,
            "the replacement worker to start",
        )
        supervisor.signal(signal.SIGTERM)
        assert supervisor.wait(30) == 0, supervisor.output()
