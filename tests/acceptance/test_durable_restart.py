"""Durable jobs through PostgreSQL restarts, with a real worker process: steps whose
in-database effects go through ``ctx.transaction()``, a durable sleep and a wait for a
signal sent meanwhile, while the test's own PostgreSQL is restarted (a fast shutdown, then
an immediate one, which is a crash and a recovery). After both: each step's effect once,
no step run again by an attempt after the one that recorded it, every result stored once,
each signal delivered once to its wait, and no step after the sleep before its end."""

from __future__ import annotations

import collections
import datetime as dt
import os
import pathlib
import shutil
import signal
import time
from collections.abc import Iterator

import pytest

import leaseq
from leaseq import JobStatus
from leaseq.dev._pgproc import read_pidfile
from leaseq.dev.embedded import EmbeddedServer
from tests.support.helpers import rows, run_sql
from tests.support.ports import free_port
from tests.support.procs import WorkerProcess, wait_for
from tests.support.requires import require
from tests.support.scratch import make_scratch

APP = "tests.support.apps.waits:app"
SCHEMA = "durable_restart"
JOBS = 6


@pytest.fixture()
def own_server() -> Iterator[EmbeddedServer]:
    """A private PostgreSQL: restarting the shared one would disturb the other tests."""
    require("postgres-server")
    base = make_scratch("leaseq-durable-restart-")
    server = EmbeddedServer(base / "pg", port=free_port())
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(base, ignore_errors=True)


def _immediate_stop(server: EmbeddedServer) -> None:
    """An immediate shutdown (SIGQUIT to the postmaster): no checkpoint, crash recovery at
    the next start, every session cut at once."""
    postmaster = read_pidfile(server.data_dir)
    assert postmaster is not None
    os.kill(postmaster.pid, signal.SIGQUIT)
    wait_for(lambda: not (server.data_dir / "postmaster.pid").exists(), 30, "the shutdown")


def _count(dsn: str, where: str) -> int:
    ((n,),) = rows(dsn, f"SELECT count(*) FROM {{s}}.jobs WHERE {where}", SCHEMA)
    return int(n)


def _called(work: pathlib.Path, step: str, ids: list[int]) -> bool:
    """Some job of ``ids`` has started ``step`` (the calls file's lines: step, job, token)."""
    lines = (work / "calls").read_text().split("\n")
    return any(f"{step} {job_id} " in line + " " for line in lines for job_id in ids)


def _signal_all(dsn: str, ids: list[int]) -> None:
    client = leaseq.Client(dsn, schema=SCHEMA)  # a fresh pool: the old one's sessions died
    try:
        for job_id in ids:
            assert client.signal(job_id, "go", {"for": job_id}), job_id
    finally:
        client.close()


@pytest.mark.slow  # a PostgreSQL of its own, restarted twice, and a worker process
def test_durable_jobs_through_a_fast_and_an_immediate_restart(
    own_server: EmbeddedServer, tmp_path: pathlib.Path
) -> None:
    dsn = own_server.ensure_running()
    client = leaseq.Client(dsn, schema=SCHEMA)
    client.migrate()
    run_sql(dsn, "CREATE TABLE {s}.ledger (job_id bigint, step text, token bigint)", SCHEMA)
    work = tmp_path / "work"
    work.mkdir()
    payload = {"dir": str(work), "seconds": 1.0, "hold": 0.3}
    ids = [client.enqueue("flow", payload) for _ in range(JOBS)]
    client.close()
    args = ("--concurrency", "3", "--poll-interval", "0.1", "--sweep-interval", "0.5")
    with WorkerProcess(dsn, SCHEMA, *args, "--lease-seconds", "3", log_dir=tmp_path, app=APP) as w:
        # The first restart lands while steps run (their transactions held open) and jobs sleep.
        wait_for(lambda: (work / "calls").exists(), 60, "the first step to start")
        own_server.stop()
        time.sleep(0.5)
        own_server.ensure_running()
        # Half the signals are sent once some job is past its sleep (the others may not
        # wait yet: buffered); the immediate shutdown lands once a signalled job is in its
        # last step (its transaction held open); the other half of the signals after it.
        wait_for(lambda: _called(work, "two", ids), 60, "a job past its sleep")
        _signal_all(dsn, ids[: JOBS // 2])
        wait_for(lambda: _called(work, "three", ids[: JOBS // 2]), 60, "a signalled job's step")
        _immediate_stop(own_server)
        time.sleep(0.5)
        own_server.ensure_running()
        _signal_all(dsn, ids[JOBS // 2 :])
        wait_for(lambda: _count(dsn, "status = 'succeeded'") == JOBS, 180, "every job to end")
        out = w.output()
    assert "Traceback" not in out, out
    final = leaseq.Client(dsn, schema=SCHEMA)
    try:
        for job_id in ids:
            job = final.get_job(job_id)
            assert job is not None and job.status is JobStatus.SUCCEEDED, job
            assert final.result(job_id, timeout=5) == ["one", "two", {"for": job_id}, "three"]
    finally:
        final.close()
    assert _count(dsn, "true") == JOBS, "nothing lost, nothing invented"
    ledger = collections.Counter(
        (job_id, step) for job_id, step, _ in rows(dsn, "SELECT * FROM {s}.ledger", SCHEMA)
    )
    assert set(ledger.values()) == {1} and len(ledger) == 3 * JOBS, ledger
    records = {
        (job_id, name): (token, at, result)
        for job_id, name, token, at, result in rows(
            dsn, "SELECT job_id, name, lease_token, recorded_at, result FROM {s}.job_steps", SCHEMA
        )
    }
    # Each ledger row was written by the attempt that recorded its step (same transaction).
    for job_id, step, token in rows(dsn, "SELECT * FROM {s}.ledger", SCHEMA):
        assert records[(job_id, step)][0] == token, (job_id, step, token)
    # A step may run again only in an attempt that never recorded it (cut by a restart
    # before its commit); never in an attempt after the one whose record committed.
    for line in (work / "calls").read_text().split("\n"):
        if line:
            step, job_id, token = line.split()
            assert int(token) <= records[(int(job_id), step)][0], line
    for job_id in ids:
        assert records[(job_id, "wait:go")][2]["payload"] == {"for": job_id}, "the signal, once"
        until = dt.datetime.fromtimestamp(records[(job_id, "nap")][2]["until"], dt.UTC)
        assert records[(job_id, "two")][1] >= until, "a step after the sleep ran before its end"
    results = rows(dsn, "SELECT job_id FROM {s}.job_results", SCHEMA)
    assert sorted(r[0] for r in results) == sorted(ids), "one stored result per job"
    signals = rows(dsn, "SELECT job_id, count(*) FROM {s}.job_signals GROUP BY job_id", SCHEMA)
    assert sorted(signals) == sorted((job_id, 1) for job_id in ids), signals
