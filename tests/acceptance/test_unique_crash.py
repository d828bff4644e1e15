"""Unique keys with real worker processes: kill -9 and SIGSTOP a worker that holds a keyed
job. Invariant: after the sweep exactly one live job holds the key, and a stale worker can
neither release nor move it."""

from __future__ import annotations

import pathlib
import signal

import pytest

import leaseq
from leaseq import JobStatus
from tests.support.helpers import rows
from tests.support.procs import WorkerProcess, wait_for

pytestmark = pytest.mark.slow  # real worker processes, signalled and killed

DRAIN = ("--drain", "--poll-interval", "0.05", "--sweep-interval", "0.1")


def _holder(dsn: str, schema: str, key: str) -> list[tuple[object, ...]]:
    return rows(
        dsn,
        "SELECT job_id, held_until IS NOT NULL FROM {s}.unique_keys WHERE unique_key = %s",
        schema,
        key,
    )


def _live(dsn: str, schema: str, key: str) -> list[int]:
    found = rows(
        dsn,
        "SELECT id FROM {s}.jobs WHERE unique_key = %s AND status IN ('pending', 'running')",
        schema,
        key,
    )
    return [int(r[0]) for r in found]


def _expired(dsn: str, schema: str) -> bool:
    ((n,),) = rows(
        dsn,
        "SELECT count(*) FROM {s}.jobs WHERE status = 'running' AND lease_expires_at <= now()",
        schema,
    )
    return int(n) == 1


def test_kill_9_of_the_holder_leaves_the_key_with_exactly_one_live_job(
    dsn: str, schema: str, client: leaseq.Client, tmp_path: pathlib.Path
) -> None:
    marker = tmp_path / "runs"
    job_id = client.enqueue(
        "touch_then_sleep",
        {"marker": str(marker), "seconds": 30, "sleep_token": 1},
        unique_key="report:7",
    )
    args = ("--lease-seconds", "1", "--poll-interval", "0.05", "--sweep-interval", "60")
    with WorkerProcess(dsn, schema, *args, log_dir=tmp_path) as a:
        wait_for(marker.exists, 30, "worker A to start the job")
        a.signal(signal.SIGKILL)
        a.wait(10)
    wait_for(lambda: _expired(dsn, schema), 10, "the dead worker's lease to expire")
    assert client.enqueue("touch_then_sleep", {}, unique_key="report:7").existing
    assert client.sweep().requeued == 1
    assert _live(dsn, schema, "report:7") == [job_id]
    assert _holder(dsn, schema, "report:7") == [(job_id, False)]
    with WorkerProcess(dsn, schema, *DRAIN, log_dir=tmp_path) as b:
        assert b.wait(60) == 0, b.output()
    job = client.get_job(job_id)
    assert job is not None and (job.status, job.lease_token) == (JobStatus.SUCCEEDED, 2)
    assert _holder(dsn, schema, "report:7") == []


def test_a_stopped_worker_cannot_release_or_move_the_key_after_it_moved_on(
    dsn: str, schema: str, client: leaseq.Client, tmp_path: pathlib.Path
) -> None:
    marker = tmp_path / "runs"
    first = client.enqueue(
        "touch_then_sleep",
        {"marker": str(marker), "seconds": 2.5, "sleep_token": 1},
        unique_key="sync:acct",
        unique_for=3600,
    )
    args = ("--burst", "--lease-seconds", "1", "--poll-interval", "0.05", "--sweep-interval", "60")
    with WorkerProcess(dsn, schema, *args, log_dir=tmp_path) as a:
        wait_for(marker.exists, 30, "worker A to start the job")
        a.signal(signal.SIGSTOP)  # frozen mid-job, lease ticking away
        # A newer payload arrives while the holder runs: a follow-up takes the key.
        follow = client.enqueue(
            "touch_then_sleep",
            {"marker": str(marker)},
            unique_key="sync:acct",
            unique_for=3600,
            debounce=0.01,
        )
        assert follow.outcome == "follow_up"
        wait_for(lambda: _expired(dsn, schema), 10, "A's lease to expire")
        # The superseded job is not requeued: that would be a second live job of the key.
        assert client.sweep().cancelled == 1
        job = client.get_job(first)
        assert job is not None and job.status is JobStatus.CANCELLED
        assert job.last_error_code == "SUPERSEDED"
        assert _live(dsn, schema, "sync:acct") == [int(follow)]
        with WorkerProcess(dsn, schema, *DRAIN, log_dir=tmp_path) as b:
            assert b.wait(60) == 0, b.output()
        assert _holder(dsn, schema, "sync:acct") == [(int(follow), True)]  # its window
        a.signal(signal.SIGCONT)  # A wakes up believing it still owns the job
        assert a.wait(30) == 0, a.output()
        out = a.output()
    assert "processed 0 job(s)" in out and "1 lost lease(s)" in out, out
    assert _holder(dsn, schema, "sync:acct") == [(int(follow), True)]
    assert client.get_job(first).status is JobStatus.CANCELLED  # type: ignore[union-attr]
    assert client.enqueue("touch_then_sleep", {}, unique_key="sync:acct").existing


def test_shutdown_release_of_a_superseded_prefetched_job_ends_it_cancelled(
    dsn: str, schema: str, client: leaseq.Client, tmp_path: pathlib.Path
) -> None:
    """Issue 28, item 1: a deploy's SIGTERM releases a prefetched keyed job whose key a
    replace moved to a follow-up meanwhile. Before the fix the release put it back to
    pending beside the follow-up: two live jobs with the key, the old payload run after it
    was replaced. Now it ends cancelled (SUPERSEDED) and only the follow-up runs."""
    marker = tmp_path / "runs"
    blocker = client.enqueue("touch_then_sleep", {"marker": str(marker), "seconds": 2})
    old = client.enqueue("touch_then_sleep", {"marker": str(marker), "v": 1}, unique_key="deploy:1")
    args = ("--concurrency", "1", "--prefetch", "1", "--poll-interval", "0.05")
    with WorkerProcess(dsn, schema, *args, log_dir=tmp_path) as worker:
        wait_for(marker.exists, 30, "the blocker to start")
        wait_for(lambda: client.get_job(old).status is JobStatus.RUNNING, 10, "the prefetch")  # type: ignore[union-attr]
        new = client.enqueue(
            "touch_then_sleep",
            {"marker": str(marker), "v": 2},
            unique_key="deploy:1",
            on_conflict="replace",
        )
        assert new.outcome == "follow_up"  # the holder is leased (prefetched), not pending
        worker.signal(signal.SIGTERM)  # finishes the blocker, releases the prefetched job
        assert worker.wait(30) == 0, worker.output()
    job = client.get_job(old)
    assert job is not None and job.status is JobStatus.CANCELLED, job
    assert job.last_error_code == "SUPERSEDED" and job.attempt_count == 0
    assert _live(dsn, schema, "deploy:1") == [int(new)]
    with WorkerProcess(dsn, schema, *DRAIN, log_dir=tmp_path) as drain:
        assert drain.wait(60) == 0, drain.output()
    started = [int(line.split(":")[0]) for line in marker.read_text().splitlines()]
    assert started == [int(blocker), int(new)], "the replaced payload never runs"
