"""Two waits for one signal name (deliveries numbered per job and name, migration 32) with a
real worker process killed (-9), or paused past its lease, between them: the first wait's
delivery, recorded before the kill, is never taken again by the second wait; the second wait
takes the second delivery, once; a resumed stale process takes none."""

from __future__ import annotations

import os
import pathlib
import signal

import pytest

import leaseq
from leaseq import JobStatus
from tests.support.helpers import expire_lease, rows, run_sql, worker_sessions_gone
from tests.support.procs import WorkerProcess, stopped, wait_for

APP = "tests.support.apps.waits:app"
FAST = ("--poll-interval", "0.05", "--sweep-interval", "0.1")


def _lapsed(dsn: str, schema: str, job_id: int) -> bool:
    ((lapsed,),) = rows(
        dsn, "SELECT lease_expires_at <= now() FROM {s}.jobs WHERE id = %s", schema, job_id
    )
    return bool(lapsed)


@pytest.mark.slow  # two worker processes per case
@pytest.mark.parametrize("how", ["kill", "pause"])
def test_two_waits_for_one_name_take_one_delivery_each_across_a_crash_or_a_pause(
    dsn: str, schema: str, client: leaseq.Client, tmp_path: pathlib.Path, how: str
) -> None:
    run_sql(dsn, "CREATE TABLE {s}.ledger (job_id bigint, step text, token bigint)", schema)
    work = tmp_path / "work"
    work.mkdir()
    job_id = client.enqueue("approve_twice", {"dir": str(work)})
    assert client.signal(job_id, "ok", "first")  # buffered for the first wait
    lease = ("--lease-seconds", "2") if how == "pause" else ()
    a = WorkerProcess(dsn, schema, *FAST, *lease, log_dir=tmp_path, app=APP)
    try:
        wait_for((work / "at").exists, 60, "the first attempt to pass its first wait")
        if how == "kill":
            a.signal(signal.SIGKILL)
            a.wait(10)
            wait_for(lambda: worker_sessions_gone(dsn, schema), 30, "its sessions to end")
            expire_lease(dsn, schema, job_id)
        else:
            a.signal(signal.SIGSTOP)
            wait_for(lambda: stopped(a.pid), 10, "the worker to stop")
            wait_for(lambda: _lapsed(dsn, schema, job_id), 30, "its lease to lapse")
        assert client.signal(job_id, "ok", "second")
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
    assert client.result(job_id, timeout=5) == ["first", "second", "done"]
    records = {r.name: r for r in client.step_records(job_id)}
    assert sorted(records) == ["after", "wait:ok", "wait:ok/2"]
    first, second = records["wait:ok"], records["wait:ok/2"]
    assert (first.result["payload"], first.result["seq"], first.lease_token) == ("first", 1, 1)
    assert (second.result["payload"], second.result["seq"], second.lease_token) == (
        "second",
        2,
        2,
    )
    sent = rows(
        dsn, "SELECT seq FROM {s}.job_signals WHERE job_id = %s ORDER BY seq", schema, job_id
    )
    assert sent == [(1,), (2,)], "one row per delivery"
    assert rows(dsn, "SELECT step, token FROM {s}.ledger", schema) == [("after", 2)]
