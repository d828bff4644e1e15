"""The command line as a person uses it: real processes, real database, one-line errors."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

import leaseq
from leaseq.dev.embedded import default_data_dir
from leaseq.dsn import describe_dsn

BASIC_APP = "tests.support.apps.basic:app"

ROOT = pathlib.Path(__file__).resolve().parents[2]


def run(
    dsn: str | None,
    schema: str,
    *args: str,
    ok: bool = True,
    env: dict[str, str] | None = None,
    stdin: bytes | None = None,
) -> subprocess.CompletedProcess[str]:
    environ = dict(os.environ)
    environ.pop("LEASEQ_DSN", None)
    if dsn is not None:
        environ["LEASEQ_DSN"] = dsn
    environ.update(env or {})
    result = subprocess.run(
        [sys.executable, "-m", "leaseq", "--schema", schema, *args],
        env=environ,
        capture_output=True,
        input=stdin.decode("utf-8", "surrogateescape") if stdin is not None else None,
        encoding="utf-8",
        errors="surrogateescape",
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
        (["worker", BASIC_APP, "--retention", "soon"], "invalid duration 'soon'"),
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


def test_destructive_command_takes_no_filter_from_the_environment(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    job_id = client.enqueue("t", max_attempts=1)
    (lease,) = client.claim(worker="w")
    client.fail(lease, "BAD_INPUT", retryable=False)
    stray = {"LEASEQ_DEAD_PURGE_QUEUE": "default", "LEASEQ_DEAD_PURGE_OLDER_THAN": "0s"}
    refused = run(dsn, schema, "dead", "purge", "--reason", "x", ok=False, env=stray)
    assert refused.returncode == 2 and "purge needs a filter" in refused.stderr
    job = client.get_job(job_id)
    assert job is not None and job.status == "dead"


def test_enqueue_reads_the_payload_from_stdin_or_a_file(
    dsn: str, schema: str, client: leaseq.Client, tmp_path: pathlib.Path
) -> None:
    from_stdin = int(run(dsn, schema, "enqueue", "t", "-", stdin=b'{"via": "stdin"}').stdout)
    path = tmp_path / "payload.json"
    path.write_text('{"via": "file", "n": [1, 2]}')
    from_file = int(run(dsn, schema, "enqueue", "t", f"@{path}").stdout)
    payloads = [job.payload for job in map(client.get_job, (from_stdin, from_file)) if job]
    assert payloads == [{"via": "stdin"}, {"via": "file", "n": [1, 2]}]
    missing = run(dsn, schema, "enqueue", "t", f"@{tmp_path / 'none.json'}", ok=False)
    assert missing.returncode == 2 and "cannot read" in missing.stderr
    assert client.count_jobs("pending") == 2, "a payload that cannot be read stores nothing"


@pytest.mark.parametrize(
    ("payload", "stdin", "needle"),
    [
        ('"\\ud800"', None, "not valid Unicode"),
        ("[" * 10_000 + "]" * 10_000, None, "nested too deeply"),
        ("1" * 5_000, None, "too many digits"),
        ("NaN", None, "NaN or Infinity"),
        ("-", b'{"a": "\xff"}', "not UTF-8"),
        ("-", b'{"a": ', "not valid JSON on stdin"),
    ],
    ids=["lone-surrogate", "deep", "long-number", "nan", "bad-utf8-stdin", "bad-json-stdin"],
)
def test_unstorable_payload_is_one_line_and_stores_nothing(
    dsn: str, schema: str, client: leaseq.Client, payload: str, stdin: bytes | None, needle: str
) -> None:
    result = run(dsn, schema, "enqueue", "t", payload, ok=False, stdin=stdin)
    (line,) = result.stderr.strip().splitlines()
    assert result.returncode == 2 and line.startswith("leaseq: error:") and needle in line, line
    assert client.count_jobs("pending") == 0


def _test_server_dir() -> str:
    configured = os.environ.get("LEASEQ_TEST_EMBEDDED_DIR")
    return configured or str(default_data_dir().parent / "test-pg")


@pytest.mark.skipif("LEASEQ_TEST_DSN" in os.environ, reason="needs the embedded test server")
def test_falling_back_to_the_embedded_server_is_loud_unless_asked_for(
    schema: str, client: leaseq.Client
) -> None:
    # The test session's own embedded server stands in for the user's.
    env = {"LEASEQ_EMBEDDED_DIR": _test_server_dir()}
    fallback = run(None, schema, "status", env=env)
    (warning,) = fallback.stderr.strip().splitlines()
    assert "embedded" in warning and _test_server_dir() in warning and "LEASEQ_DSN" in warning
    asked = run("embedded", schema, "status", env=env)
    assert asked.stderr == "" and asked.stdout == fallback.stdout


def test_worker_says_which_database_it_serves(dsn: str, schema: str, client: leaseq.Client) -> None:
    result = run(dsn, schema, "worker", BASIC_APP, "--burst")
    assert f"worker serving {describe_dsn(dsn)} (schema {schema})" in result.stderr
    as_json = run(dsn, schema, "--log-format", "json", "worker", BASIC_APP, "--burst")
    (line,) = as_json.stderr.strip().splitlines()
    assert json.loads(line)["message"].startswith("worker serving postgresql://"), line
