"""The command line as a person uses it: real processes, real database, one-line errors."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

import leaseq

BASIC_APP = "tests.support.apps.basic:app"

ROOT = pathlib.Path(__file__).resolve().parents[2]


def run(
    dsn: str | None, schema: str, *args: str, ok: bool = True
) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env.pop("LEASEQ_DSN", None)
    if dsn is not None:
        env["LEASEQ_DSN"] = dsn
    result = subprocess.run(
        [sys.executable, "-m", "leaseq", "--schema", schema, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    if ok:
        assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    return result


@pytest.mark.slow  # a dozen CLI processes in a row
def test_migrate_enqueue_status_show(dsn: str, schema: str) -> None:
    assert "version" in run(dsn, schema, "migrate").stdout
    assert "version" in run(dsn, schema, "migrate").stdout, "migrate is idempotent"
    job_id = int(run(dsn, schema, "enqueue", "mail.send", '{"to": "x@y.z"}', "-q", "emails").stdout)
    out = json.loads(run(dsn, schema, "enqueue", "t", "--json", "--delay", "60").stdout)
    assert out["id"] == job_id + 1
    stats = json.loads(run(dsn, schema, "status", "--json").stdout)
    by_queue = {s["queue"]: s for s in stats}
    assert by_queue["emails"]["ready"] == 1 and by_queue["default"]["scheduled"] == 1
    assert "emails" in run(dsn, schema, "status").stdout
    shown = json.loads(run(dsn, schema, "jobs", "show", str(job_id), "--json").stdout)
    assert shown["job"]["payload"] == {"to": "x@y.z"} and shown["job"]["status"] == "pending"
    assert "history:" in run(dsn, schema, "jobs", "show", str(job_id)).stdout


@pytest.mark.slow  # a dozen CLI processes in a row
def test_dead_list_replay_and_cancel(dsn: str, schema: str, client: leaseq.Client) -> None:
    job_id = client.enqueue("t", max_attempts=1)
    (lease,) = client.claim(worker="w")
    client.fail(lease, "BAD_INPUT", retryable=False, detail="field x missing")
    listed = json.loads(
        run(dsn, schema, "dead", "list", "--json", "--error-code", "BAD_INPUT").stdout
    )
    assert [j["job_id"] for j in listed] == [job_id]
    assert "BAD_INPUT" in run(dsn, schema, "dead", "list").stdout
    assert json.loads(run(dsn, schema, "dead", "list", "--json", "--queue", "other").stdout) == []

    refused = run(dsn, schema, "replay", str(job_id), ok=False)
    assert refused.returncode == 2 and "--reason" in refused.stderr
    out = run(dsn, schema, "replay", str(job_id), "--reason", "fixed", "--actor", "bob").stdout
    assert "replayed by bob" in out
    again = run(dsn, schema, "replay", str(job_id), "--reason", "again", ok=False)
    assert again.returncode == 1
    assert again.stderr.strip() == (
        f"leaseq: error: job {job_id} is pending, not dead; only dead jobs can be replayed"
    )
    assert "cancelled" in run(dsn, schema, "cancel", str(job_id)).stdout
    gone = run(dsn, schema, "cancel", "999999", ok=False)
    assert gone.returncode == 1 and "no job with id 999999" in gone.stderr
    events = [e.event for e in client.job_events(job_id)]
    assert events == ["dead", "replayed", "cancelled"]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["enqueue", "bad task;drop"], "invalid task name"),
        (["enqueue", "t", "{not json"], "not valid JSON"),
        (["enqueue", "t", "--priority", "-99999"], "priority must be between"),
        (["enqueue", "t", "--queue", "q'; DROP SCHEMA x; --"], "invalid queue name"),
        (["enqueue", "t", "--queue", "ü" * 300], "invalid queue name"),
        (["enqueue", "t", "--max-attempts", "0"], "max_attempts must be between"),
        (["jobs", "show", "abc"], "not a valid integer"),
        (["worker", "no_such_module:app"], "cannot import"),
        (["worker", BASIC_APP, "--concurrency", "-1"], "concurrency must be"),
        (
            ["worker", BASIC_APP, "--lease-seconds", "0"],
            "lease_seconds must be",
        ),
        (["worker", "tests.support.apps.basic"], "expected MODULE:APP"),
        (["frobnicate"], "No such command"),
    ],
)
def test_bad_arguments_get_one_line_not_a_traceback(
    dsn: str, schema: str, client: leaseq.Client, args: list[str], needle: str
) -> None:
    result = run(dsn, schema, *args, ok=False)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("leaseq: error:") and needle in lines[0], lines


def test_unreachable_database_is_one_line(schema: str) -> None:
    result = run("postgresql://nobody@127.0.0.1:1/none", schema, "status", ok=False)
    assert result.returncode == 1
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(
        "leaseq: error: cannot connect to PostgreSQL at postgresql://nobody@127.0.0.1:1/none: "
    ), line


def test_malformed_dsn_is_one_line(schema: str) -> None:
    result = run("this is === not a dsn", schema, "status", ok=False)
    (line,) = result.stderr.strip().splitlines()
    assert "DSN" in line and result.returncode in (1, 2)


def test_unmigrated_schema_says_what_to_do(dsn: str, schema: str) -> None:
    result = run(dsn, schema, "worker", BASIC_APP, "--burst", ok=False)
    assert result.returncode == 1
    assert "run `leaseq migrate`" in result.stderr


def test_demo_runs_end_to_end(dsn: str, schema: str) -> None:
    result = run(dsn, "leaseq", "demo", "--schema", schema, "--jobs", "20")
    out = result.stdout
    assert "19 succeeded, 1 dead" in out, out
    assert "emails" in out and "payments" in out
    assert "leaseq --schema" in out and "replay" in out
