"""A gathering parent woken by its last child's end (jobs_child_ended, migration 31), with a
real worker process killed (-9) inside the transaction of the children's completion, while
that transaction waits for the parent's gate row: nothing of it commits, the children run
again on another worker, and their end wakes the parent once (its poll is an hour: only a
child's end can wake it within the test), which gets both results."""

from __future__ import annotations

import collections
import pathlib
import signal

import psycopg
import pytest
from psycopg import sql

import leaseq
from leaseq import JobStatus
from tests.support.helpers import rows, run_sql
from tests.support.procs import WorkerProcess, wait_for

APP = "tests.support.apps.waits:app"
FAST = ("--poll-interval", "0.05", "--sweep-interval", "0.1")


def _status(client: leaseq.Client, job_id: int) -> JobStatus | None:
    job = client.get_job(job_id)
    return None if job is None else job.status


def _blocked(dsn: str, schema: str) -> bool:
    ((n,),) = rows(
        dsn,
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE %s",
        schema,
        f"%{schema}%",
    )
    return bool(n)


@pytest.mark.slow  # two worker processes
def test_kill_9_inside_the_childrens_ending_transaction_wakes_the_parent_once_later(
    dsn: str, schema: str, client: leaseq.Client, tmp_path: pathlib.Path
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    parent = client.enqueue("gatherer", {"dir": str(work)})
    a = WorkerProcess(dsn, schema, *FAST, log_dir=tmp_path, app=APP)
    gate = psycopg.connect(dsn)
    try:
        wait_for(lambda: _status(client, parent) is JobStatus.SUSPENDED, 60, "the gather")
        wait_for(
            lambda: (
                rows(dsn, "SELECT count(*) FROM {s}.jobs WHERE status = 'running'", schema)
                == [(2,)]
            ),
            60,
            "both children to run",
        )
        gate.execute(
            sql.SQL("SELECT 1 FROM {}.job_fanin WHERE parent_id = %s FOR UPDATE").format(
                sql.Identifier(schema)
            ),
            (parent,),
        )
        (work / "go").write_text("")
        wait_for(lambda: _blocked(dsn, schema), 60, "a child's end to wait for the gate")
        a.signal(signal.SIGKILL)
        a.wait(10)
    finally:
        a.kill()
        gate.rollback()
        gate.close()
    kids = rows(dsn, "SELECT status::text FROM {s}.jobs WHERE parent_id = %s", schema, parent)
    assert kids == [("running",), ("running",)], "nothing of the killed completion committed"
    assert _status(client, parent) is JobStatus.SUSPENDED
    run_sql(dsn, "UPDATE {s}.jobs SET lease_expires_at = now() WHERE status = 'running'", schema)
    with WorkerProcess(dsn, schema, *FAST, log_dir=tmp_path, app=APP) as b:
        wait_for(lambda: _status(client, parent) is JobStatus.SUCCEEDED, 60, "the parent")
        b.signal(signal.SIGTERM)
        b.wait(30)
    assert client.result(parent, timeout=5) == [10, 20], "both children's results"
    woken = rows(
        dsn,
        "SELECT detail FROM {s}.job_events WHERE job_id = %s AND event = 'woken'",
        schema,
        parent,
    )
    assert len(woken) == 1 and "children ended" in woken[0][0], woken
    lines = (work / "calls").read_text().split("\n")
    calls = collections.Counter(line.split()[0] for line in lines if line)
    assert calls == {"kid1": 2, "kid2": 2}, "each child ran again after the kill"
