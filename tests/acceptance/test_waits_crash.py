"""Durable sleep and signals with real worker processes: killed (-9) in the middle of the
suspension's transaction (its row lock held up by the test) and right after it committed;
paused (SIGSTOP) past its lease before the sleep; a signal sent while the job is being
suspended, in both orders. After each: every step's database write once, no recorded step
run again, the sleep never ended before its time, the signal delivered once, one result."""

from __future__ import annotations

import collections
import datetime as dt
import os
import pathlib
import signal
import threading
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

import leaseq
from leaseq import JobStatus
from tests.support.helpers import expire_lease, rows, run_sql, worker_sessions_gone
from tests.support.procs import WorkerProcess, stopped, wait_for

APP = "tests.support.apps.waits:app"
FAST = ("--poll-interval", "0.05", "--sweep-interval", "0.1")
SUSPEND_FENCE = "%cancel_requested_at IS NOT NULL%"  # suspend_fence's text
SIGNAL_LOCK = "%FOR NO KEY UPDATE%"  # signal_lock's text


def _calls(work: pathlib.Path) -> collections.Counter[str]:
    lines = (work / "calls").read_text().split("\n")
    return collections.Counter(line.split()[0] for line in lines if line)


def _waiting_on_a_lock(dsn: str, like: str, schema: str) -> bool:
    ((n,),) = rows(
        dsn,
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
        " AND query LIKE %s AND query LIKE %s",
        schema,
        like,
        f"%{schema}%",
    )
    return int(n) > 0


@pytest.fixture()
def work(dsn: str, schema: str, tmp_path: pathlib.Path) -> Iterator[pathlib.Path]:
    run_sql(dsn, "CREATE TABLE {s}.ledger (job_id bigint, step text, token bigint)", schema)
    folder = tmp_path / "work"
    folder.mkdir()
    yield folder


class RowLock:
    """The test's FOR SHARE on a job row: a worker's suspension (FOR UPDATE) and a signal's
    send (FOR NO KEY UPDATE) queue behind it; a step record (FOR SHARE) does not."""

    def __init__(self, dsn: str, schema: str, job_id: int) -> None:
        self.conn = psycopg.connect(dsn)
        self.conn.execute(
            sql.SQL("SELECT 1 FROM {}.jobs WHERE id = %s FOR SHARE").format(sql.Identifier(schema)),
            (job_id,),
        )

    def release(self) -> None:
        self.conn.rollback()
        self.conn.close()


def _check(dsn: str, schema: str, job_id: int, work: pathlib.Path) -> dict[str, Any]:
    ledger = rows(dsn, "SELECT step FROM {s}.ledger ORDER BY step", schema)
    assert ledger == [("one",), ("two",)], f"each step's write once: {ledger}"
    assert _calls(work) == collections.Counter({"one": 1, "two": 1}), _calls(work)
    steps = {
        name: (result, at)
        for name, result, at in rows(
            dsn,
            "SELECT name, result, recorded_at FROM {s}.job_steps WHERE job_id = %s",
            schema,
            job_id,
        )
    }
    return steps


def _run_to_the_end(dsn: str, schema: str, tmp_path: pathlib.Path) -> None:
    with WorkerProcess(dsn, schema, "--drain", *FAST, log_dir=tmp_path, app=APP) as b:
        assert b.wait(90) == 0, b.output()


@pytest.mark.slow  # two worker processes per case
@pytest.mark.parametrize("when", ["inside", "after"])
def test_kill_9_in_the_suspension_or_right_after_it_never_ends_the_sleep_early(
    dsn: str,
    schema: str,
    client: leaseq.Client,
    tmp_path: pathlib.Path,
    work: pathlib.Path,
    when: str,
) -> None:
    job_id = client.enqueue("nap", {"dir": str(work), "seconds": 1.0})
    a = WorkerProcess(dsn, schema, *FAST, log_dir=tmp_path, app=APP)
    try:
        wait_for((work / "at").exists, 60, "the first attempt to reach the sleep")
        if when == "inside":
            lock = RowLock(dsn, schema, job_id)
            (work / "go").write_text("")
            wait_for(lambda: _waiting_on_a_lock(dsn, SUSPEND_FENCE, schema), 30, "the suspension")
            a.signal(signal.SIGKILL)
            a.wait(10)
            lock.release()  # its session, waiting on the lock, now finds the client gone
            wait_for(lambda: worker_sessions_gone(dsn, schema), 30, "its sessions to end")
            job = client.get_job(job_id)
            assert job is not None and job.status is JobStatus.RUNNING, "nothing committed"
            expire_lease(dsn, schema, job_id)
        else:
            (work / "go").write_text("")
            wait_for(
                lambda: client.get_job(job_id).status is JobStatus.SUSPENDED,  # type: ignore[union-attr]
                30,
                "the suspension to commit",
            )
            a.signal(signal.SIGKILL)
            a.wait(10)
            wait_for(lambda: worker_sessions_gone(dsn, schema), 30, "its sessions to end")
    finally:
        a.kill()
    _run_to_the_end(dsn, schema, tmp_path)
    job = client.get_job(job_id)
    assert job is not None and job.status is JobStatus.SUCCEEDED
    assert client.result(job_id, timeout=5) == "two"
    steps = _check(dsn, schema, job_id, work)
    until = dt.datetime.fromtimestamp(steps["nap"][0]["until"], dt.UTC)
    assert steps["two"][1] >= until, "the step after the sleep ran before its time"
    assert steps["nap"][1] + dt.timedelta(seconds=0.99) <= until, "fixed once, the first time"


@pytest.mark.slow
def test_a_worker_paused_past_its_lease_before_the_sleep_records_nothing(
    dsn: str, schema: str, client: leaseq.Client, tmp_path: pathlib.Path, work: pathlib.Path
) -> None:
    job_id = client.enqueue("nap", {"dir": str(work), "seconds": 0.5})
    a = WorkerProcess(dsn, schema, *FAST, "--lease-seconds", "2", log_dir=tmp_path, app=APP)
    try:
        wait_for((work / "at").exists, 60, "the first attempt to reach the sleep")
        a.signal(signal.SIGSTOP)
        wait_for(lambda: stopped(a.pid), 10, "the worker to stop")
        wait_for(
            lambda: rows(
                dsn, "SELECT lease_expires_at <= now() FROM {s}.jobs WHERE id = %s", schema, job_id
            )[0][0],
            30,
            "its lease to lapse",
        )
        _run_to_the_end(dsn, schema, tmp_path)
        os.kill(a.pid, signal.SIGCONT)
        (work / "go").write_text("")
        wait_for((work / "lost").exists, 30, "the resumed worker to learn it lost the lease")
    finally:
        a.kill()
    assert client.result(job_id, timeout=5) == "two"
    steps = _check(dsn, schema, job_id, work)
    assert rows(
        dsn,
        "SELECT lease_token FROM {s}.job_steps WHERE job_id = %s AND name = 'nap'",
        schema,
        job_id,
    ) == [(2,)], "the sleep was recorded by the second worker only"
    assert steps["two"][1] >= dt.datetime.fromtimestamp(steps["nap"][0]["until"], dt.UTC)


@pytest.mark.slow
@pytest.mark.parametrize("first", ["suspension", "signal"])
def test_a_signal_sent_while_the_job_is_being_suspended_is_delivered_once(
    dsn: str,
    schema: str,
    client: leaseq.Client,
    tmp_path: pathlib.Path,
    work: pathlib.Path,
    first: str,
) -> None:
    job_id = client.enqueue("approve", {"dir": str(work)})
    sent: list[bool] = []
    sender = threading.Thread(target=lambda: sent.append(client.signal(job_id, "go", {"ok": 1})))
    with WorkerProcess(dsn, schema, *FAST, log_dir=tmp_path, app=APP):
        wait_for((work / "at").exists, 60, "the first attempt to reach the wait")
        lock = RowLock(dsn, schema, job_id)
        if first == "suspension":
            (work / "go").write_text("")
            wait_for(lambda: _waiting_on_a_lock(dsn, SUSPEND_FENCE, schema), 30, "the suspension")
            sender.start()
            wait_for(lambda: _waiting_on_a_lock(dsn, SIGNAL_LOCK, schema), 30, "the signal")
        else:
            sender.start()
            wait_for(lambda: _waiting_on_a_lock(dsn, SIGNAL_LOCK, schema), 30, "the signal")
            (work / "go").write_text("")
            wait_for(lambda: _waiting_on_a_lock(dsn, SUSPEND_FENCE, schema), 30, "the suspension")
        lock.release()
        sender.join(30)
        assert sent == [True]
        wait_for(
            lambda: client.get_job(job_id).status is JobStatus.SUCCEEDED,  # type: ignore[union-attr]
            60,
            "the job to finish",
        )
    assert client.result(job_id, timeout=5) == {"decision": {"ok": 1}}
    _check(dsn, schema, job_id, work)
    events = [
        e
        for (e,) in rows(
            dsn, "SELECT event FROM {s}.job_events WHERE job_id = %s ORDER BY id", schema, job_id
        )
    ]
    # The order the row lock gave: suspended then woken by the signal, or the signal found
    # at the wait and delivered without a suspension.
    assert events == (["suspended", "signalled"] if first == "suspension" else []), events
    ((record,),) = rows(
        dsn,
        "SELECT result FROM {s}.job_steps WHERE job_id = %s AND name = 'wait:go'",
        schema,
        job_id,
    )
    assert record["payload"] == {"ok": 1}


@pytest.mark.slow
def test_kill_9_after_the_spawn_never_spawns_the_children_twice(
    dsn: str, schema: str, client: leaseq.Client, tmp_path: pathlib.Path, work: pathlib.Path
) -> None:
    parent = client.enqueue("fan", {"dir": str(work)})
    with WorkerProcess(dsn, schema, *FAST, log_dir=tmp_path, app=APP) as a:
        wait_for((work / "at").exists, 60, "the parent to spawn its children")
        a.signal(signal.SIGKILL)
        a.wait(10)
        wait_for(lambda: worker_sessions_gone(dsn, schema), 30, "its sessions to end")
    expire_lease(dsn, schema, parent)
    _run_to_the_end(dsn, schema, tmp_path)
    assert client.result(parent, timeout=5) == 60
    ((spawned,),) = rows(dsn, "SELECT count(*) FROM {s}.jobs WHERE task = 'child'", schema)
    assert spawned == 3, "the rerun got its children from the spawn step's record"


@pytest.mark.slow
def test_kill_9_inside_the_spawns_transaction_spawns_the_children_once(
    dsn: str, schema: str, client: leaseq.Client, tmp_path: pathlib.Path, work: pathlib.Path
) -> None:
    parent = client.enqueue("fan", {"dir": str(work)})
    # The test's SHARE lock on job_children holds the spawn's children_record (the last
    # statement of the spawning step's transaction, after every child's enqueue) until the
    # worker is gone: the kill lands with the children written and nothing committed.
    lock = psycopg.connect(dsn)
    lock.execute(sql.SQL("LOCK TABLE {}.job_children IN SHARE MODE").format(sql.Identifier(schema)))
    a = WorkerProcess(dsn, schema, *FAST, "--lease-seconds", "2", log_dir=tmp_path, app=APP)
    try:
        wait_for(
            lambda: _waiting_on_a_lock(dsn, "%job_children%", schema), 60, "the spawn's insert"
        )
        a.signal(signal.SIGKILL)
        a.wait(10)
    finally:
        a.kill()
        lock.rollback()
        lock.close()
    assert not (work / "at").exists(), "the first attempt never got past the spawn"
    assert rows(dsn, "SELECT count(*) FROM {s}.jobs WHERE task = 'child'", schema) == [(0,)]
    assert rows(dsn, "SELECT count(*) FROM {s}.job_children", schema) == [(0,)]
    assert rows(dsn, "SELECT count(*) FROM {s}.job_steps", schema) == [(0,)]
    wait_for(
        lambda: rows(
            dsn, "SELECT lease_expires_at <= now() FROM {s}.jobs WHERE id = %s", schema, parent
        )[0][0],
        30,
        "its lease to lapse",
    )
    _run_to_the_end(dsn, schema, tmp_path)
    assert client.result(parent, timeout=5) == 60, "gather returned the children's results"
    children = rows(dsn, "SELECT id, payload FROM {s}.jobs WHERE task = 'child'", schema)
    assert sorted(p["n"] for _, p in children) == [1, 2, 3], children
    recorded = rows(
        dsn, "SELECT child_id FROM {s}.job_children WHERE parent_id = %s", schema, parent
    )
    assert sorted(recorded) == sorted((i,) for i, _ in children), "each child named once"
    ((token,),) = rows(
        dsn,
        "SELECT lease_token FROM {s}.job_steps WHERE job_id = %s AND name LIKE 'spawn%%'",
        schema,
        parent,
    )
    assert token == 2, "the spawn was recorded by the second attempt only"
