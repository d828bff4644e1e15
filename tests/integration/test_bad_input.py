"""Bad input from every side: hostile payloads and names written straight into the table,
injection attempts through the CLI, a DSN pointing nowhere, a schema newer than the code.
Each gets a clear error or a dead job with a code; the worker keeps running; other jobs are
unaffected."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from typing import Any

import pytest

import leaseq
from leaseq import JobStatus
from tests.support.helpers import rows, run_sql
from tests.support.procs import ROOT

HOSTILE_NAMES = [
    "x'; DROP TABLE jobs; --",
    'quo"te',
    "semi;colon",
    "ünïcødé-名前",
    "a" * 5000,
    "",
    "new\nline",
]


def _cli(dsn: str | None, schema: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, LEASEQ_SCHEMA=schema, PYTHONPATH=str(ROOT))
    env.pop("LEASEQ_DSN", None)
    if dsn is not None:
        env["LEASEQ_DSN"] = dsn
    return subprocess.run(
        [sys.executable, "-m", "leaseq", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )


def _one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode in (1, 2), result
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("leaseq: error: "), lines
    return lines[0]


@pytest.mark.parametrize("name", HOSTILE_NAMES)
def test_hostile_names_through_the_cli_are_refused_in_one_line(
    dsn: str, schema: str, client: leaseq.Client, name: str
) -> None:
    for args in (
        ("enqueue", name),
        ("enqueue", "t", "--queue", name),
        ("dead", "list", "--queue", name),
        ("worker", "tests.support.apps.basic:app", "--queue", name),
    ):
        result = _cli(dsn, schema, *args)
        if args[0] == "dead" and result.returncode == 0:
            # Filtering by a strange queue name is harmless: it is a bound parameter.
            assert result.stdout.strip() == "no dead jobs"
            continue
        _one_line_error(result)
    ((count,),) = rows(dsn, "SELECT count(*) FROM {s}.jobs", schema)
    assert count == 0
    assert rows(dsn, "SELECT to_regclass(%s) IS NOT NULL", schema, f"{schema}.jobs") == [(True,)]


def test_garbage_written_straight_into_the_table_goes_dead_and_nothing_else_suffers(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    """Other producers (SQL, other languages) bypass the client's checks: the worker must
    survive whatever they store."""
    app = leaseq.App(dsn, schema=schema)
    handled: list[Any] = []

    @app.task(name="typed", validate=lambda p: int(p["n"]))
    def typed(ctx: leaseq.JobContext, n: Any) -> None:
        handled.append(n)

    deep = "[" * 500 + "]" * 500
    for task, payload in [
        ("x'; DROP TABLE jobs; --", "{}"),
        ("typed", '"just a string"'),
        ("typed", '{"n": "not a number"}'),
        ("typed", deep),
        ("typed", json.dumps({"n": 1, "blob": "x" * 2_000_000})),
        ("typed", "null"),
    ]:
        run_sql(
            dsn,
            "INSERT INTO {s}.jobs (queue_name, task, payload) VALUES ('default', %s, %s::jsonb)",
            schema,
            task,
            payload,
        )
    good = client.enqueue("typed", {"n": 42})
    stats = asyncio.run(
        leaseq.Worker(app, leaseq.WorkerConfig(poll_interval=0.02, drain=True)).run()
    )
    jobs = rows(dsn, "SELECT id, status::text, last_error_code FROM {s}.jobs ORDER BY id", schema)
    assert [(status, code) for _, status, code in jobs] == [
        ("dead", "UNKNOWN_TASK"),
        ("dead", "INVALID_PAYLOAD"),
        ("dead", "INVALID_PAYLOAD"),
        ("dead", "INVALID_PAYLOAD"),
        ("succeeded", None),  # 2 MB is a valid payload for SQL producers; the client caps at 1
        ("dead", "INVALID_PAYLOAD"),
        ("succeeded", None),
    ]
    assert client.get_job(good).status is JobStatus.SUCCEEDED  # type: ignore[union-attr]
    assert handled == [1, 42] and stats.lost_leases == 0


@pytest.mark.slow  # one CLI process per command
def test_a_dsn_pointing_nowhere_is_one_line_for_every_command(schema: str) -> None:
    nowhere = "postgresql://leaseq@127.0.0.1:1/leaseq"
    for args in (
        ("migrate",),
        ("status",),
        ("enqueue", "t"),
        ("worker", "tests.support.apps.basic:app"),
        ("dead", "list"),
        ("jobs", "show", "1"),
    ):
        line = _one_line_error(_cli(nowhere, schema, *args))
        assert "cannot connect to PostgreSQL at postgresql://leaseq@127.0.0.1:1/leaseq" in line


def test_a_schema_newer_than_the_code_stops_the_worker_with_one_line(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    run_sql(dsn, "INSERT INTO {s}.schema_version (version, name) VALUES (999, 'future')", schema)
    line = _one_line_error(_cli(dsn, schema, "worker", "tests.support.apps.basic:app", "--burst"))
    assert "newer than this leaseq understands" in line and "upgrade leaseq" in line
    line = _one_line_error(_cli(dsn, schema, "migrate"))
    assert "upgrade leaseq" in line


@pytest.mark.slow  # one CLI process per absurd number
def test_absurd_numbers_are_refused(dsn: str, schema: str, client: leaseq.Client) -> None:
    for args in (
        ("enqueue", "t", "--priority", "99999999999999999999"),
        ("enqueue", "t", "--delay", "nan"),
        ("enqueue", "t", "--delay", "-5"),
        ("enqueue", "t", "--max-attempts", "100000000"),
        ("worker", "tests.support.apps.basic:app", "--lease-seconds", "inf"),
        ("worker", "tests.support.apps.basic:app", "--concurrency", "0"),
        ("worker", "tests.support.apps.basic:app", "--batch-size", "5000"),
        ("worker", "tests.support.apps.basic:app", "--retention", "forever-ish"),
        ("dead", "list", "--limit", "0"),
        ("jobs", "show", "99999999999999999999999"),
    ):
        _one_line_error(_cli(dsn, schema, *args))
