"""Crash tests with real worker processes: pause, kill, cut the listener, restart the
database, stop gracefully, supervise. Each names the boundary it breaks."""

from __future__ import annotations

import os
import pathlib
import shutil
import signal
import threading
import time
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql

import leaseq
from leaseq import JobStatus
from leaseq.dev.embedded import EmbeddedServer
from leaseq.worker.listener import LISTENER_APPLICATION_NAME
from tests.support.helpers import claim_waits_on_a_lock, expire_lease, rows
from tests.support.ports import free_port
from tests.support.procs import WorkerProcess, alive, children, wait_for
from tests.support.requires import require
from tests.support.scratch import make_scratch

pytestmark = pytest.mark.slow  # real worker processes, signalled and killed


def _count(dsn: str, schema: str, where: str) -> int:
    ((n,),) = rows(dsn, f"SELECT count(*) FROM {{s}}.jobs WHERE {where}", schema)
    return int(n)


def test_seed_3_paused_worker_resumes_and_reports_nothing(
    dsn: str, schema: str, client: leaseq.Client, tmp_path: pathlib.Path
) -> None:
    marker = tmp_path / "runs"
    job_id = client.enqueue(
        "touch_then_sleep", {"marker": str(marker), "seconds": 2.5, "sleep_token": 1}
    )
    args = ("--burst", "--lease-seconds", "1", "--poll-interval", "0.05", "--sweep-interval", "60")
    with WorkerProcess(dsn, schema, *args, log_dir=tmp_path) as a:
        wait_for(marker.exists, 30, "worker A to start the job")
        a.signal(signal.SIGSTOP)  # A is frozen mid-job, lease ticking away
        wait_for(
            lambda: _count(dsn, schema, "status = 'running' AND lease_expires_at <= now()") == 1,
            10,
            "A's lease to expire",
        )
        with WorkerProcess(
            dsn,
            schema,
            "--drain",
            "--poll-interval",
            "0.05",
            "--sweep-interval",
            "0.1",
            log_dir=tmp_path,
        ) as b:
            assert b.wait(60) == 0, b.output()
        job = client.get_job(job_id)
        assert job is not None and (job.status, job.lease_token) == (JobStatus.SUCCEEDED, 2)
        finished_at = job.finished_at

        a.signal(signal.SIGCONT)  # A wakes up believing it still owns the job
        assert a.wait(30) == 0, a.output()
        out = a.output()
    assert "processed 0 job(s)" in out and "1 lost lease(s)" in out, out
    job = client.get_job(job_id)
    assert job is not None and job.finished_at == finished_at and job.lease_token == 2
    assert [line.split(":")[1] for line in marker.read_text().splitlines()] == ["1", "2"]
    assert [e.event for e in client.job_events(job_id)] == ["lease_expired"]


def test_worker_paused_between_claim_and_start_never_starts_under_the_ended_lease(
    dsn: str, schema: str, client: leaseq.Client, tmp_path: pathlib.Path
) -> None:
    """Boundary: the gap between a claim's commit and the handler's start. The worker's
    claim is held on a table lock, the worker is SIGSTOPped, the lock released (the claim
    commits, its answer waits in the socket) and the lease left to end; then SIGCONT.
    Invariant: the handler never starts under that token; the job runs once, under the
    next token, after a sweep."""
    marker = tmp_path / "runs"
    args = ("--lease-seconds", "2", "--poll-interval", "0.05", "--sweep-interval", "0.2")
    with WorkerProcess(dsn, schema, *args, log_dir=tmp_path) as worker:
        with psycopg.connect(dsn) as conn:
            conn.execute(
                sql.SQL("LOCK TABLE {}.jobs IN ACCESS EXCLUSIVE MODE").format(
                    sql.Identifier(schema)
                )
            )
            job_id = client.enqueue("touch_then_sleep", {"marker": str(marker)}, connection=conn)
            wait_for(lambda: claim_waits_on_a_lock(dsn, schema), 30, "the claim to block")
            time.sleep(1.8)  # most of the lease passes while the claim waits
            worker.signal(signal.SIGSTOP)
            conn.commit()
        wait_for(
            lambda: _count(dsn, schema, "status = 'running' AND lease_expires_at <= now()") == 1,
            10,
            "the paused worker's lease to end",
        )
        time.sleep(0.1)  # margin: the local deadline is no later than the database's
        worker.signal(signal.SIGCONT)
        wait_for(lambda: _count(dsn, schema, "status = 'succeeded'") == 1, 30, "the retry")
        worker.signal(signal.SIGTERM)
        assert worker.wait(30) == 0, worker.output()
        out = worker.output()
    assert "lease ended before its handler could start" in out or "lease lost" in out, out
    assert [line.split(":")[1] for line in marker.read_text().splitlines()] == ["2"]
    job = client.get_job(job_id)
    assert job is not None and (job.status, job.lease_token) == (JobStatus.SUCCEEDED, 2)


def test_seed_9_polling_drains_while_every_listener_is_killed(
    dsn: str, schema: str, client: leaseq.Client, tmp_path: pathlib.Path
) -> None:
    stop = threading.Event()
    killed = 0

    def kill_listeners() -> None:
        nonlocal killed
        with psycopg.connect(dsn, autocommit=True) as conn:
            while not stop.is_set():
                # This test's listeners only (their LISTEN names the schema): other tests'
                # workers share the database.
                cur = conn.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE application_name = %s AND pid <> pg_backend_pid() "
                    "AND strpos(query, %s) > 0",
                    (LISTENER_APPLICATION_NAME, schema),
                )
                killed += sum(1 for (ok,) in cur.fetchall() if ok)
                stop.wait(0.02)

    with WorkerProcess(dsn, schema, "--poll-interval", "0.5", log_dir=tmp_path) as worker:
        killer = threading.Thread(target=kill_listeners)
        killer.start()
        try:
            total = 0
            for _ in range(10):
                total += len(client.enqueue_many([{"task": "noop"} for _ in range(30)]))
                time.sleep(0.1)
            wait_for(lambda: _count(dsn, schema, "status = 'succeeded'") == total, 30, "drain")
        finally:
            stop.set()
            killer.join()
        assert worker.proc.poll() is None, "the worker must survive losing its listener"
        worker.signal(signal.SIGTERM)
        assert worker.wait(30) == 0, worker.output()
    assert killed >= 1, "no listener connection was ever killed: the test proved nothing"
    assert "Traceback" not in worker.output()


@pytest.fixture()
def own_server() -> Iterator[EmbeddedServer]:
    """A private PostgreSQL this test may restart without disturbing the others."""
    require("postgres-server")
    base = make_scratch("leaseq-restart-")  # RAM-backed when there is room
    # A port of its own, so this cluster never fights the main one.
    server = EmbeddedServer(base / "pg", port=free_port())
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(base, ignore_errors=True)


def test_database_restart_mid_drain_loses_nothing(
    own_server: EmbeddedServer, tmp_path: pathlib.Path
) -> None:
    dsn = own_server.ensure_running()
    schema = "restart_test"
    client = leaseq.Client(dsn, schema=schema)
    client.migrate()
    total = len(client.enqueue_many([{"task": "sleepy"} for _ in range(3000)]))
    client.close()
    with WorkerProcess(
        dsn,
        schema,
        "--drain",
        "--concurrency",
        "8",
        "--poll-interval",
        "0.1",
        "--sweep-interval",
        "1",
        log_dir=tmp_path,
    ) as worker:
        wait_for(lambda: _count(dsn, schema, "status = 'succeeded'") > 200, 30, "progress")
        own_server.stop()
        time.sleep(1.0)  # the outage
        own_server.ensure_running()
        assert worker.wait(120) == 0, worker.output()
        out = worker.output()
    assert out.count("database unavailable") <= 3, "one line per outage, not a storm"
    assert "database reachable again" in out
    assert "Traceback" not in out
    assert _count(dsn, schema, "status = 'succeeded'") == total
    assert _count(dsn, schema, "true") == total, "nothing lost, nothing invented"


def test_sigterm_during_drain_finishes_running_and_releases_prefetched(
    dsn: str, schema: str, client: leaseq.Client, tmp_path: pathlib.Path
) -> None:
    marker = tmp_path / "runs"
    ids = client.enqueue_many(
        [{"task": "touch_then_sleep", "payload": {"marker": str(marker), "seconds": 1.5}}] * 6
    )
    args = ("--concurrency", "2", "--prefetch", "2", "--poll-interval", "0.05")
    with WorkerProcess(dsn, schema, *args, log_dir=tmp_path) as worker:
        wait_for(
            lambda: marker.exists() and len(marker.read_text().splitlines()) == 2,
            30,
            "two jobs to start",
        )
        wait_for(lambda: _count(dsn, schema, "status = 'running'") == 4, 10, "2 prefetched")
        worker.signal(signal.SIGTERM)
        assert worker.wait(30) == 0, worker.output()
    states = {}
    for job_id in ids:
        job = client.get_job(job_id)
        assert job is not None
        states[job_id] = (str(job.status), job.attempt_count)
    assert sorted(states.values()) == [("pending", 0)] * 4 + [("succeeded", 1)] * 2
    assert len(marker.read_text().splitlines()) == 2, "no new job started after SIGTERM"


def test_supervisor_restarts_a_killed_process_and_stops_cleanly(
    dsn: str, schema: str, client: leaseq.Client, tmp_path: pathlib.Path
) -> None:
    with WorkerProcess(
        dsn, schema, "--processes", "2", "--poll-interval", "0.1", log_dir=tmp_path
    ) as sup:
        wait_for(lambda: len(children(sup.pid)) == 2, 30, "two worker processes")
        first = children(sup.pid)
        victim = min(first)
        os.kill(victim, signal.SIGKILL)
        wait_for(
            lambda: len(children(sup.pid)) == 2 and victim not in children(sup.pid),
            30,
            "the killed process to be replaced",
        )
        total = len(client.enqueue_many([{"task": "noop"} for _ in range(300)]))
        wait_for(lambda: _count(dsn, schema, "status = 'succeeded'") == total, 30, "drain")
        kids = children(sup.pid)
        sup.signal(signal.SIGTERM)
        assert sup.wait(30) == 0, sup.output()
        assert "restarting" in sup.output()
    assert not any(alive(pid) for pid in kids), "children must exit with the supervisor"


def test_second_signal_abandons_running_jobs_at_once(
    dsn: str, schema: str, client: leaseq.Client, tmp_path: pathlib.Path
) -> None:
    marker = tmp_path / "runs"
    job_id = client.enqueue("touch_then_sleep", {"marker": str(marker), "seconds": 60})
    with WorkerProcess(dsn, schema, "--poll-interval", "0.05", log_dir=tmp_path) as worker:
        wait_for(marker.exists, 30, "the job to start")
        worker.signal(signal.SIGTERM)
        time.sleep(0.3)
        assert worker.proc.poll() is None, "first signal waits for the running job"
        started = time.monotonic()
        worker.signal(signal.SIGTERM)
        assert worker.wait(30) == 3, worker.output()
        assert time.monotonic() - started < 10
    # The sync handler's thread was still inside time.sleep when the process exited, so
    # the worker wrote nothing for it: a job whose handler may still be running is never
    # offered again before its lease expires (docs/worker.md, "Stopping a sync handler").
    job = client.get_job(job_id)
    assert job is not None and job.status is JobStatus.RUNNING and job.lease_token == 1
    # The lease then expires like a crashed worker's, and the sweep gives the job back.
    expire_lease(dsn, schema, job_id, seconds_ago=0.1)
    client.sweep()
    job = client.get_job(job_id)
    assert job is not None and job.status is JobStatus.PENDING


def test_backends_terminated_during_a_drain_lose_nothing(
    dsn: str, schema: str, client: leaseq.Client, tmp_path: pathlib.Path
) -> None:
    total = len(client.enqueue_many([{"task": "sleepy"} for _ in range(1500)]))
    stop = threading.Event()
    terminated = 0

    def terminate_workers() -> None:
        nonlocal terminated
        with psycopg.connect(dsn, autocommit=True) as conn:
            while not stop.is_set():
                # This test's workers only: every leaseq statement names the schema, so
                # a backend's last query does (other tests' workers share the database;
                # killing theirs failed their attempts with AdminShutdown).
                cur = conn.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE application_name LIKE 'leaseq-%%' AND pid <> pg_backend_pid() "
                    "AND strpos(query, %s) > 0",
                    (schema,),
                )
                terminated += sum(1 for (ok,) in cur.fetchall() if ok)
                stop.wait(1.0)

    with WorkerProcess(
        dsn,
        schema,
        "--drain",
        "--concurrency",
        "8",
        "--poll-interval",
        "0.05",
        "--sweep-interval",
        "0.5",
        log_dir=tmp_path,
    ) as worker:
        killer = threading.Thread(target=terminate_workers)
        killer.start()
        try:
            assert worker.wait(120) == 0, worker.output()
        finally:
            stop.set()
            killer.join()
        out = worker.output()
    assert terminated >= 3, "the drain was too quick to be disturbed: the test proved nothing"
    assert "Traceback" not in out
    assert _count(dsn, schema, "status = 'succeeded'") == total
