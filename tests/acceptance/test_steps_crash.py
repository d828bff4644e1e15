"""Durable steps with real worker processes killed (-9) or paused (SIGSTOP past the lease)
before, inside and after a step. After each: every step's in-database write is in the
ledger exactly once, a step whose record committed never ran again (nor did one that was
not in flight when the lease ended), and the job succeeded once with every step recorded
once."""

from __future__ import annotations

import collections
import os
import pathlib
import signal

import pytest

import leaseq
from leaseq import JobStatus
from tests.support.helpers import expire_lease, rows, run_sql, worker_sessions_gone
from tests.support.procs import WorkerProcess, stopped, wait_for

APP = "tests.support.apps.steps:app"
FAST = ("--poll-interval", "0.05", "--sweep-interval", "0.1")


def _calls(work: pathlib.Path) -> collections.Counter[str]:
    lines = (work / "calls").read_text().split("\n")
    return collections.Counter(line.split()[0] for line in lines if line)


def _succeeded(client: leaseq.Client, ids: list[int]) -> bool:
    jobs = [client.get_job(i) for i in ids]
    return all(j is not None and j.status is JobStatus.SUCCEEDED for j in jobs)


def _lease_lapsed(dsn: str, schema: str, job_id: int) -> bool:
    ((lapsed,),) = rows(
        dsn, "SELECT lease_expires_at <= now() FROM {s}.jobs WHERE id = %s", schema, job_id
    )
    return bool(lapsed)


@pytest.mark.slow  # two worker processes per case
@pytest.mark.parametrize("point", ["before", "inside", "after"])
@pytest.mark.parametrize("how", ["kill", "pause"])
def test_steps_survive_a_crash_or_a_pause_past_the_lease_at_each_boundary(
    dsn: str, schema: str, client: leaseq.Client, tmp_path: pathlib.Path, how: str, point: str
) -> None:
    run_sql(dsn, "CREATE TABLE {s}.ledger (job_id bigint, step text, token bigint)", schema)
    work = tmp_path / "work"
    work.mkdir()
    job_id = client.enqueue("three_steps", {"dir": str(work), "point": point})
    lease = ("--lease-seconds", "2") if how == "pause" else ()
    a = WorkerProcess(dsn, schema, *FAST, *lease, log_dir=tmp_path, app=APP)
    try:
        wait_for((work / "at").exists, 60, f"the first attempt to reach {point!r}")
        if how == "kill":
            a.signal(signal.SIGKILL)
            a.wait(10)
            wait_for(lambda: worker_sessions_gone(dsn, schema), 30, "its sessions to end")
            expire_lease(dsn, schema, job_id)
        else:
            a.signal(signal.SIGSTOP)
            wait_for(lambda: stopped(a.pid), 10, "the worker to stop")
            wait_for(lambda: _lease_lapsed(dsn, schema, job_id), 30, "its lease to lapse")
        with WorkerProcess(dsn, schema, "--drain", *FAST, log_dir=tmp_path, app=APP) as b:
            assert b.wait(60) == 0, b.output()
        if how == "pause":
            os.kill(a.pid, signal.SIGCONT)
            (work / "go").write_text("")
            wait_for((work / "lost").exists, 30, "the resumed worker to learn it lost the lease")
    finally:
        a.kill()
    job = client.get_job(job_id)
    assert job is not None and job.status is JobStatus.SUCCEEDED, job
    two = "two@1" if point == "after" else "two@2"  # recorded by the first attempt, or not
    assert client.result(job_id, timeout=5) == ["one@1", two, "three@2"]
    ledger = rows(dsn, "SELECT step, token FROM {s}.ledger ORDER BY step", schema)
    recorded = rows(
        dsn, "SELECT name, lease_token FROM {s}.job_steps WHERE job_id = %s", schema, job_id
    )
    assert sorted(ledger) == sorted(recorded), "each write once, under its step's record"
    assert len(recorded) == 3
    calls = _calls(work)
    # Only the step in flight when the lease ended may have run twice (never recorded by
    # the first attempt); every other step's function ran once across both workers.
    assert calls == collections.Counter(
        {"one": 1, "two": 2 if point == "inside" else 1, "three": 1}
    ), calls


@pytest.mark.slow  # two worker processes per case
@pytest.mark.parametrize(
    ("how", "point"), [("kill", "after"), ("kill", "inside"), ("pause", "inside")]
)
def test_steps_without_a_transaction_recorded_in_shared_writes_survive_a_crash_or_a_pause(
    dsn: str, schema: str, client: leaseq.Client, tmp_path: pathlib.Path, how: str, point: str
) -> None:
    """The batching boundary: a step with no ctx.transaction() has its record written in
    one statement with other jobs' records (the worker's group commit). Killed right after
    the step returned, its record is there (it committed before the handler went on) and
    the step never runs again; killed or paused inside it, nothing was recorded, and the
    resumed process's record (through the shared write, which the jobs it claimed meanwhile
    may share) is refused by the fence."""
    work, others = tmp_path / "work", tmp_path / "others"
    work.mkdir()
    others.mkdir()
    job_id = client.enqueue("pure_steps", {"dir": str(work), "point": point})
    # Jobs running beside it on the same worker, so that the writes are shared. (Not before
    # a pause: a paused worker in the middle of a completion's transaction would hold those
    # jobs' rows, and the other worker could not sweep them until it resumes.)
    fillers = [
        client.enqueue("pure_steps", {"dir": str(others), "point": "none"})
        for _ in range(30 if how == "kill" else 0)
    ]
    lease = ("--lease-seconds", "2") if how == "pause" else ()
    a = WorkerProcess(dsn, schema, *FAST, *lease, log_dir=tmp_path, app=APP)
    try:
        wait_for((work / "at").exists, 60, f"the first attempt to reach {point!r}")
        if how == "kill":
            a.signal(signal.SIGKILL)
            a.wait(10)
            wait_for(lambda: worker_sessions_gone(dsn, schema), 30, "its sessions to end")
            expire_lease(dsn, schema, job_id)
            run_sql(
                dsn, "UPDATE {s}.jobs SET lease_expires_at = now() WHERE status = 'running'", schema
            )
        else:
            a.signal(signal.SIGSTOP)
            wait_for(lambda: stopped(a.pid), 10, "the worker to stop")
            wait_for(lambda: _lease_lapsed(dsn, schema, job_id), 30, "its lease to lapse")
        with WorkerProcess(dsn, schema, "--drain", *FAST, log_dir=tmp_path, app=APP) as b:
            assert b.wait(60) == 0, b.output()
        if how == "pause":
            # Give the resumed worker other jobs' records to share its refused write with.
            more = [
                client.enqueue("pure_steps", {"dir": str(others), "point": "none"})
                for _ in range(10)
            ]
            fillers += more
            os.kill(a.pid, signal.SIGCONT)
            (work / "go").write_text("")
            wait_for((work / "lost").exists, 30, "the resumed worker to learn it lost the lease")
            wait_for(lambda: _succeeded(client, more), 60, "the resumed worker to run the new jobs")
    finally:
        a.kill()
    job = client.get_job(job_id)
    assert job is not None and job.status is JobStatus.SUCCEEDED, job
    two = "two@1" if point == "after" else "two@2"
    assert client.result(job_id, timeout=5) == ["one@1", two, "three@2"]
    recorded = rows(
        dsn, "SELECT name, lease_token FROM {s}.job_steps WHERE job_id = %s", schema, job_id
    )
    assert sorted(recorded) == [("one", 1), ("three", 2), ("two", 1 if point == "after" else 2)]
    assert _calls(work) == collections.Counter(
        {"one": 1, "two": 2 if point == "inside" else 1, "three": 1}
    )
    assert _succeeded(client, fillers)
    ((count, distinct),) = rows(
        dsn,
        "SELECT count(*), count(DISTINCT (job_id, name)) FROM {s}.job_steps WHERE job_id <> %s",
        schema,
        job_id,
    )
    assert count == distinct == 3 * len(fillers), "each filler's step recorded once"
