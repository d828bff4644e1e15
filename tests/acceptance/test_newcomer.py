"""Issue 30, the worker and the command line as a newcomer meets them: ``--burst`` waits for
jobs a rate limit holds back and says what a pause left behind; retries and dead jobs are
logged at the default level naming their task; the start line names queues and tasks; a
schema that was never migrated reads the same one line from the API, the CLI and the
worker."""

from __future__ import annotations

import asyncio

import pytest

import leaseq
from leaseq.errors import SchemaError
from tests.acceptance.test_cli import run

APP = "tests.support.apps.newcomer:app"


@pytest.mark.slow  # real worker processes
def test_burst_waits_for_rate_limited_jobs_and_reports_paused_ones(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    for n in range(4):  # 10/s with a burst of 1: the last ones are admitted after waits
        client.enqueue("limited.ping", {"n": n})
    client.enqueue("held.report", {}, queue="reports")
    client.pause("reports", reason="month end")
    done = run(dsn, schema, "worker", APP, "--burst", "-q", "default", "-q", "reports")
    assert client.count_jobs("succeeded") == 4
    assert "processed 4 job(s)" in done.stdout
    assert "1 job(s) left pending behind a pause" in done.stdout, done.stdout


@pytest.mark.slow  # a real worker process
def test_retries_and_dead_jobs_are_logged_by_default_with_their_task(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    job_id = int(client.enqueue("flaky.upstream", {}))
    done = run(dsn, schema, "worker", APP, "--drain")  # no -v
    lines = done.stderr.splitlines()
    assert any(
        f"job {job_id} (task flaky.upstream) will be retried after attempt 1" in line
        for line in lines
    ), done.stderr
    assert any(f"job {job_id} (task flaky.upstream) dead after attempt" in line for line in lines)
    (start,) = [line for line in lines if "worker serving" in line]
    assert start.endswith("queues: default; tasks: flaky.upstream, held.report, limited.ping")


def test_a_schema_never_migrated_reads_one_way_everywhere(dsn: str, schema: str) -> None:
    expected = f"schema {schema!r} is not set up in this database; run `leaseq migrate`"
    with leaseq.Client(dsn, schema=schema) as client:
        with pytest.raises(SchemaError, match="run `leaseq migrate`") as raised:
            client.enqueue("mail.send", {})
        assert str(raised.value).startswith(expected)
        with pytest.raises(SchemaError) as raised:
            client.queue_stats()
        assert str(raised.value).startswith(expected)

    async def in_async() -> str:
        async with leaseq.AsyncClient(dsn, schema=schema) as aclient:
            with pytest.raises(SchemaError) as raised:
                await aclient.enqueue("mail.send", {})
            return str(raised.value)

    assert asyncio.run(in_async()).startswith(expected)
    for args in (("status",), ("enqueue", "mail.send", "{}"), ("worker", APP, "--burst")):
        result = run(dsn, schema, *args, ok=False)
        assert result.returncode != 0
        assert (
            result.stderr.strip().splitlines()[-1].endswith(expected + f" (with --schema {schema})")
        ), (args, result.stderr)
