"""Bad input from every side: hostile payloads and names written straight into the table or
given to every enqueue path (too deep, lone surrogates, NUL, non-string keys, a trailing
newline), injection attempts through the CLI, a DSN pointing nowhere, a schema newer than the
code. Each gets a clear one-line error and stores nothing, or a dead job with a code; the
worker keeps running; other jobs are unaffected."""

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
from leaseq.client import COPY_THRESHOLD
from leaseq.validate import PAYLOAD_MAX_DEPTH
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
    # Handlers run concurrently (the 2 MB payload is decoded on its handler thread).
    assert sorted(handled) == [1, 42] and stats.lost_leases == 0


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


def _nested(levels: int) -> Any:
    value: Any = []
    for _ in range(levels - 1):
        value = [value]
    return value


HOSTILE_PAYLOADS = [
    pytest.param(_nested(5_000), id="5000-deep"),
    pytest.param(_nested(10_000), id="10000-deep"),
    pytest.param(_nested(990), id="990-deep-worker-could-not-decode"),
    pytest.param({"s": "\ud800"}, id="lone-surrogate"),
    pytest.param({"\udfff": 1}, id="lone-surrogate-key"),
    pytest.param({1: "a", "1": "b"}, id="colliding-keys"),
    pytest.param({"x": [{2: "int key"}]}, id="nested-int-key"),
    pytest.param({"p": "C:\\u0000\x00"}, id="real-nul-after-escaped-text"),
]


@pytest.mark.parametrize("payload", HOSTILE_PAYLOADS)
def test_hostile_payloads_are_one_line_payload_errors_on_every_enqueue_path(
    dsn: str, schema: str, client: leaseq.Client, payload: Any
) -> None:
    """enqueue, enqueue_many (one statement) and enqueue_many past the COPY threshold:
    each refuses with a one-line PayloadError (no RecursionError or UnicodeEncodeError
    escapes) and stores nothing, even when the bad job is the last of a large batch."""
    good = [{"task": "t", "payload": {"n": i}} for i in range(COPY_THRESHOLD)]
    for call in (
        lambda: client.enqueue("t", payload),
        lambda: client.enqueue_many(
            [{"task": "t", "payload": {"n": 0}}, {"task": "t", "payload": payload}]
        ),
        lambda: client.enqueue_many([*good, {"task": "t", "payload": payload}]),
    ):
        with pytest.raises(leaseq.PayloadError) as info:
            call()
        assert str(info.value) and "\n" not in str(info.value)
    assert rows(dsn, "SELECT count(*) FROM {s}.jobs", schema) == [(0,)]


def test_names_and_schema_with_a_trailing_newline_are_refused(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    """ "$" matches before a final newline: "t\\n" used to be stored, and a schema "s\\n"
    reached PostgreSQL as a syntax error."""
    for call in (
        lambda: client.enqueue("t\n"),
        lambda: client.enqueue("t", queue="q\n"),
        lambda: client.enqueue_many([{"task": "t\n"}]),
        lambda: leaseq.Client(dsn, schema="s\n").migrate(),
    ):
        with pytest.raises(leaseq.ConfigError):
            call()
    assert rows(dsn, "SELECT count(*) FROM {s}.jobs", schema) == [(0,)]
    assert rows(dsn, "SELECT to_regnamespace(%s) IS NULL", schema, '"s\n"') == [(True,)]


def test_payloads_round_trip_exactly_at_the_edges(client: leaseq.Client) -> None:
    """Text that merely looks like a NUL escape is stored as given, and the deepest payload
    enqueue accepts is one a worker can decode."""
    payloads = [
        {"p": "C:\\u0000dir", "q": "\\\\u0000", "k\\u0000": 1},
        {"deep": _nested(PAYLOAD_MAX_DEPTH - 1)},
        {"1": "string keys that look numeric are fine", "true": None},
    ]
    ids = client.enqueue_many([{"task": "t", "payload": p} for p in payloads])
    leases = sorted(client.claim(worker="w", limit=10), key=lambda lease: lease.job_id)
    assert [lease.job_id for lease in leases] == ids
    assert [lease.payload for lease in leases] == payloads


def test_handler_error_codes_and_details_with_surrogates_or_nul_are_stored(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    """A handler's exception text is not ours to choose: a lone surrogate or NUL in its code
    or detail must not make the failure write itself fail."""
    job_id = client.enqueue("t", max_attempts=1)
    (lease,) = client.claim(worker="w")
    assert client.fail(lease, "E\ud800\x00", detail="bad \udfff \x00 text", retryable=False)
    assert rows(
        dsn, "SELECT status::text, last_error_code, last_error_detail FROM {s}.jobs", schema
    ) == [("dead", "E?", "bad ?  text")]
    assert client.get_job(job_id).status is JobStatus.DEAD  # type: ignore[union-attr]
