"""Pauses with real worker processes and the real command line. The boundaries: every
worker killed (-9) and restarted while a queue is paused; a pause landing in the middle of a
busy drain; an operator's typing at `leaseq pause` / `resume` / `pauses`."""

from __future__ import annotations

import json
import pathlib

import pytest

import leaseq
from tests.acceptance.test_cli import run
from tests.support.helpers import rows
from tests.support.procs import WorkerProcess, wait_for

# Two queues: "other" is the control, proving the workers poll while "default" is paused.
WORKER_ARGS = ("--any-queue", "-q", "default", "-q", "other", "--poll-interval", "0.05")


def _count(dsn: str, schema: str, where: str, *params: object) -> int:
    ((n,),) = rows(dsn, f"SELECT count(*) FROM {{s}}.jobs WHERE {where}", schema, *params)
    return int(n)


def _control_round(client: leaseq.Client, dsn: str, schema: str, n: int = 5) -> None:
    """Jobs of the unpaused queue, run to the end: the workers have been polling since."""
    ids = client.enqueue_many([{"task": "noop", "queue": "other"} for _ in range(n)])
    wait_for(
        lambda: _count(dsn, schema, "id = ANY(%s) AND status = 'succeeded'", ids) == n,
        60,
        "the control jobs of the unpaused queue",
    )


def _started(worker: WorkerProcess) -> bool:
    return " started: queues=" in worker.output()


@pytest.mark.slow  # four worker processes, two killed with -9
def test_pause_survives_kill_9_and_restart_of_every_worker(
    dsn: str, schema: str, client: leaseq.Client, tmp_path: pathlib.Path
) -> None:
    with (
        WorkerProcess(dsn, schema, *WORKER_ARGS, log_dir=tmp_path) as a,
        WorkerProcess(dsn, schema, *WORKER_ARGS, log_dir=tmp_path) as b,
    ):
        _control_round(client, dsn, schema)
        client.pause("default", reason="deploy", actor="ops")
        a.kill()  # SIGKILL: nothing of theirs survives but the database
        b.kill()
    with (
        WorkerProcess(dsn, schema, *WORKER_ARGS, log_dir=tmp_path) as c,
        WorkerProcess(dsn, schema, *WORKER_ARGS, log_dir=tmp_path) as d,
    ):
        wait_for(lambda: _started(c) and _started(d), 60, "the new workers to start")
        paused = client.enqueue_many([{"task": "noop"} for _ in range(20)])
        for _ in range(3):
            _control_round(client, dsn, schema)
        assert _count(dsn, schema, "id = ANY(%s) AND attempt_count > 0", paused) == 0, (
            "a paused queue's job was claimed after a restart"
        )
        assert client.resume("default", actor="ops")
        wait_for(
            lambda: _count(dsn, schema, "id = ANY(%s) AND status = 'succeeded'", paused) == 20,
            60,
            "the resumed queue to drain",
        )


@pytest.mark.slow  # two worker processes draining a few thousand jobs
def test_pause_during_a_busy_drain_lets_no_claim_commit_after_it(
    dsn: str, schema: str, client: leaseq.Client, tmp_path: pathlib.Path
) -> None:
    total = 3000
    ids = client.enqueue_many(
        [{"task": "sleepy", "payload": {"seconds": 0.01}} for _ in range(total)]
    )
    args = (*WORKER_ARGS, "--concurrency", "10", "--batch-size", "10")
    with (
        WorkerProcess(dsn, schema, *args, log_dir=tmp_path),
        WorkerProcess(dsn, schema, *args, log_dir=tmp_path),
    ):
        wait_for(lambda: _count(dsn, schema, "status = 'succeeded'") >= 100, 60, "the drain to run")
        client.pause("default", reason="mid-drain")
        claimed = {
            r[0] for r in rows(dsn, "SELECT id FROM {s}.jobs WHERE attempt_count > 0", schema)
        }
        assert len(claimed) < total, "the drain ended before the pause: make it longer"
        wait_for(
            lambda: _count(dsn, schema, "status = 'running'") == 0, 60, "running jobs to finish"
        )
        for _ in range(3):
            _control_round(client, dsn, schema)
        later = {
            r[0]
            for r in rows(
                dsn,
                "SELECT id FROM {s}.jobs WHERE attempt_count > 0 AND queue_name = 'default'",
                schema,
            )
        }
        assert later == claimed, "a job of the paused queue was claimed after pause() returned"
        ((paused_at, last_start, retried),) = rows(
            dsn,
            "SELECT (SELECT paused_at FROM {s}.pauses), max(started_at), "
            "count(*) FILTER (WHERE attempt_count > 1) "
            "FROM {s}.jobs WHERE queue_name = 'default'",
            schema,
        )
        assert paused_at > last_start, "a claim started after the pause's time"
        assert retried == 0
        assert _count(dsn, schema, "id = ANY(%s) AND status = 'pending'", ids) > 0
        client.resume("default")
        wait_for(
            lambda: _count(dsn, schema, "id = ANY(%s) AND status = 'succeeded'", ids) == total,
            120,
            "the resumed queue to drain",
        )


def test_pause_resume_and_list_from_the_command_line(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    client.enqueue("noop", queue="mail")
    out = run(dsn, schema, "pause", "mail", "--reason", "smtp down", "--actor", "ann").stdout
    assert "queue 'mail' paused by ann" in out
    run(dsn, schema, "pause", "--task", "resize", "--reason", "bad build")
    run(dsn, schema, "pause", "--ordering-key", "acct-7", "--reason", "asked")
    run(dsn, schema, "pause", "empty-queue", "--reason", "not yet")
    listed = json.loads(run(dsn, schema, "pauses", "--json").stdout)
    assert [(p["scope"], p["value"], p["reason"]) for p in listed] == [
        ("ordering_key", "acct-7", "asked"),
        ("queue", "empty-queue", "not yet"),
        ("queue", "mail", "smtp down"),
        ("task", "resize", "bad build"),
    ]
    assert "smtp down" in run(dsn, schema, "pauses").stdout
    status = run(dsn, schema, "status").stdout
    assert "mail (paused)" in status
    assert "paused queues without jobs: empty-queue" in status
    assert "1 task(s), 1 ordering key(s)" in status
    (mail,) = json.loads(run(dsn, schema, "status", "--json").stdout)
    assert mail["paused"] is True
    assert "resumed by bob" in run(dsn, schema, "resume", "mail", "--actor", "bob").stdout
    assert "was not paused" in run(dsn, schema, "resume", "mail").stdout
    assert [a.action for a in client.admin_events()][:2] == ["resume", "pause"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("pause", "q"), "pause needs --reason"),
        (("pause", "--reason", "x"), "exactly one scope"),
        (("pause", "q", "--task", "t", "--reason", "x"), "exactly one scope"),
        (("pause", "bad name", "--reason", "x"), "invalid queue name"),
        (("resume",), "exactly one scope"),
    ],
)
def test_bad_pause_commands_are_one_line_and_store_nothing(
    dsn: str, schema: str, client: leaseq.Client, args: tuple[str, ...], message: str
) -> None:
    result = run(dsn, schema, *args, ok=False)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and message in result.stderr, result.stderr
    assert client.pauses() == [] and client.admin_events() == []
