"""Dependencies with real worker processes: a diamond and a 1,000-node fan-out/fan-in
drained by two workers, a worker killed (-9) after its parent job's side effect, and a
stopped (SIGSTOP) worker whose late completion comes after its lease was taken over.
Invariants: no job starts before all its dependencies finished (database clock), the
fan-in starts exactly once, a stale completion promotes nothing."""

from __future__ import annotations

import pathlib
import signal

import pytest

import leaseq
from leaseq import JobStatus, Ref
from tests.support.helpers import rows
from tests.support.procs import WorkerProcess, wait_for

pytestmark = pytest.mark.slow  # real worker processes, signalled and killed

DRAIN = ("--drain", "--poll-interval", "0.05", "--sweep-interval", "0.1")


def _started_before_dependencies_ended(
    dsn: str, schema: str, marker: pathlib.Path
) -> list[tuple[int, int]]:
    """(job, dependency) pairs where a start of the job came before the dependency's handler
    returned under the lease that ended it: must be none. Read from the handlers' own
    marker lines (an append-only file, one order across processes), not from started_at and
    finished_at: those are each transaction's now(), its start, and a claim whose statement
    began a moment before the promoting transaction committed still sees the promotion, yet
    records an earlier started_at than its dependency's finished_at (seen once under load)."""
    edges = rows(
        dsn,
        """SELECT d.job_id, d.depends_on, p.lease_token, p.status = 'succeeded'
           FROM {s}.job_deps AS d JOIN {s}.jobs AS p ON p.id = d.depends_on""",
        schema,
    )
    lines = marker.read_text().splitlines()
    starts: dict[int, list[int]] = {}
    ends: dict[tuple[int, int], int] = {}
    for n, line in enumerate(lines):
        part = line.split(":")
        if part[0] == "end":
            ends[(int(part[1]), int(part[2]))] = n
        else:
            starts.setdefault(int(part[0]), []).append(n)
    bad = []
    for job, dep, token, succeeded in edges:
        end = ends.get((dep, token))
        if not succeeded or end is None or not starts.get(job) or min(starts[job]) < end:
            bad.append((job, dep))
    return bad


def _runs(marker: pathlib.Path, job_id: int) -> int:
    lines = marker.read_text().splitlines() if marker.exists() else []
    return sum(1 for line in lines if line.split(":")[0] == str(job_id))


def test_diamond_and_1000_node_fan_out_fan_in_with_two_workers(
    dsn: str, schema: str, client: leaseq.Client, tmp_path: pathlib.Path
) -> None:
    marker = tmp_path / "runs"
    touch = {"marker": str(marker), "mark_end": True}
    a, b, c, d = client.enqueue_many(
        [
            {"task": "touch_then_sleep", "payload": touch},
            {"task": "touch_then_sleep", "payload": touch, "depends_on": [Ref(0)]},
            {"task": "touch_then_sleep", "payload": touch, "depends_on": [Ref(0)]},
            {"task": "touch_then_sleep", "payload": touch, "depends_on": [Ref(1), Ref(2)]},
        ]
    )
    root = client.enqueue("touch_then_sleep", touch, depends_on=[d])
    fan = client.enqueue_many(
        [{"task": "touch_then_sleep", "payload": touch, "depends_on": [root]} for _ in range(1000)]
    )
    fan_in = client.enqueue("touch_then_sleep", touch, depends_on=[int(x) for x in fan])
    with (
        WorkerProcess(dsn, schema, *DRAIN, "--concurrency", "16", log_dir=tmp_path) as w1,
        WorkerProcess(dsn, schema, *DRAIN, "--concurrency", "16", log_dir=tmp_path) as w2,
    ):
        assert w1.wait(120) == 0, w1.output()
        assert w2.wait(120) == 0, w2.output()
    ((n_done,),) = rows(dsn, "SELECT count(*) FROM {s}.jobs WHERE status = 'succeeded'", schema)
    assert n_done == 1006
    assert _started_before_dependencies_ended(dsn, schema, marker) == []
    assert [_runs(marker, int(j)) for j in (a, b, c, d, fan_in)] == [1, 1, 1, 1, 1]
    job = client.get_job(fan_in)
    assert job is not None and job.lease_token == 1
    assert [e.event for e in client.job_events(fan_in)] == ["promoted"]


def test_kill_9_after_the_parents_side_effect_reruns_the_parent_and_the_child_once(
    dsn: str, schema: str, client: leaseq.Client, tmp_path: pathlib.Path
) -> None:
    marker = tmp_path / "runs"  # one file for both: its order is the handlers' order
    touch = {"marker": str(marker), "mark_end": True}
    parent = client.enqueue("touch_then_sleep", {**touch, "seconds": 30, "sleep_token": 1})
    child = client.enqueue("touch_then_sleep", touch, depends_on=[parent])
    args = ("--lease-seconds", "1", "--poll-interval", "0.05", "--sweep-interval", "60")
    with WorkerProcess(dsn, schema, *args, log_dir=tmp_path) as a:
        wait_for(marker.exists, 30, "worker A to start the parent")  # side effect done
        a.signal(signal.SIGKILL)
        a.wait(10)
    assert client.get_job(child).status is JobStatus.PENDING  # type: ignore[union-attr]
    with WorkerProcess(dsn, schema, *DRAIN, log_dir=tmp_path) as b:
        assert b.wait(60) == 0, b.output()
    assert _runs(marker, parent) == 2  # re-run after the crash
    assert _runs(marker, child) == 1
    assert _started_before_dependencies_ended(dsn, schema, marker) == []


def test_a_stopped_workers_late_completion_promotes_nothing(
    dsn: str, schema: str, client: leaseq.Client, tmp_path: pathlib.Path
) -> None:
    parent_marker, child_marker = tmp_path / "parent", tmp_path / "child"
    parent = client.enqueue(
        "touch_then_sleep", {"marker": str(parent_marker), "seconds": 1.5, "sleep_token": 1}
    )
    child = client.enqueue("touch_then_sleep", {"marker": str(child_marker)}, depends_on=[parent])
    args = ("--burst", "--lease-seconds", "1", "--poll-interval", "0.05", "--sweep-interval", "60")
    with WorkerProcess(dsn, schema, *args, log_dir=tmp_path) as a:
        wait_for(parent_marker.exists, 30, "worker A to start the parent")
        a.signal(signal.SIGSTOP)  # frozen mid-job, lease ticking away
        wait_for(
            lambda: bool(
                rows(
                    dsn,
                    "SELECT 1 FROM {s}.jobs WHERE id = %s AND lease_expires_at <= now()",
                    schema,
                    parent,
                )
            ),
            10,
            "A's lease to expire",
        )
        assert client.sweep().requeued == 1
        rows(
            dsn,
            "UPDATE {s}.jobs SET available_at = now() WHERE id = %s RETURNING 1",
            schema,
            parent,
        )
        (fresh,) = client.claim("default", worker="test", lease_seconds=60)
        assert fresh.job_id == parent
        a.signal(signal.SIGCONT)  # A wakes up believing it still owns the parent
        assert a.wait(30) == 0, a.output()
        assert "1 lost lease(s)" in a.output(), a.output()
        ((waiting,),) = rows(dsn, "SELECT waiting FROM {s}.jobs WHERE id = %s", schema, child)
        assert waiting, "a stale completion promoted the child"
        assert client.complete(fresh)
    with WorkerProcess(dsn, schema, *DRAIN, log_dir=tmp_path) as b:
        assert b.wait(60) == 0, b.output()
    assert _runs(child_marker, child) == 1
    assert [e.event for e in client.job_events(child)] == ["promoted"]


def test_batch_callbacks_fire_exactly_once_when_a_worker_is_killed_during_the_last_jobs(
    dsn: str, schema: str, client: leaseq.Client, tmp_path: pathlib.Path
) -> None:
    marker, callback_marker = tmp_path / "runs", tmp_path / "callbacks"
    callback = leaseq.Sig("batch_callback", {"marker": str(callback_marker)})
    with client.batch(on_success=callback, on_finish=callback) as batch:
        batch.enqueue_many(
            [{"task": "noop"} for _ in range(50)]
            + [
                {
                    "task": "touch_then_sleep",
                    "payload": {"marker": str(marker), "seconds": 30, "sleep_token": 1},
                }
                for _ in range(3)
            ]
        )
    args = ("--lease-seconds", "1", "--poll-interval", "0.05", "--sweep-interval", "60")
    with WorkerProcess(dsn, schema, *args, "--concurrency", "8", log_dir=tmp_path) as a:
        wait_for(
            lambda: marker.exists() and len(marker.read_text().splitlines()) == 3,
            30,
            "worker A to start the last jobs",
        )
        a.signal(signal.SIGKILL)
        a.wait(10)
    assert rows(dsn, "SELECT count(*) FROM {s}.batch_callbacks", schema) == [(0,)]
    with (
        WorkerProcess(dsn, schema, *DRAIN, "--concurrency", "8", log_dir=tmp_path) as b,
        WorkerProcess(dsn, schema, *DRAIN, "--concurrency", "8", log_dir=tmp_path) as c,
    ):
        assert b.wait(60) == 0, b.output()
        assert c.wait(60) == 0, c.output()
    kinds = rows(dsn, "SELECT kind FROM {s}.batch_callbacks ORDER BY kind", schema)
    assert kinds == [("finish",), ("success",)]
    # Each callback ran once, with the counts of the finished batch.
    assert sorted(callback_marker.read_text().splitlines()) == ["finish 53/53", "success 53/53"]
    info = client.get_batch(batch.id)
    assert info is not None and info.state == "done" and info.counts == {"succeeded": 53}
