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


@pytest.mark.slow  # a dozen CLI processes
def test_jobs_list_bulk_cancel_and_run_now(dsn: str, schema: str, client: leaseq.Client) -> None:
    import json

    a1 = client.enqueue("mail.send", {}, queue="a")
    client.enqueue("mail.digest", {}, queue="a")
    b1 = client.enqueue("mail.send", {}, queue="b")
    listed = json.loads(run(dsn, schema, "jobs", "list", "-q", "a", "--json").stdout)
    assert sorted(j["task"] for j in listed) == ["mail.digest", "mail.send"]
    by_task = json.loads(run(dsn, schema, "jobs", "list", "--task", "mail.send", "--json").stdout)
    assert sorted(j["job_id"] for j in by_task) == [a1, b1]
    assert run(dsn, schema, "jobs", "list", "--state", "dead").stdout.strip() == "no dead jobs"
    assert "mail.digest" in run(dsn, schema, "jobs", "list").stdout  # the table

    dry = run(dsn, schema, "cancel", "-q", "a", "--dry-run")
    assert dry.stdout.strip() == "would cancel 2 pending job(s)"
    assert client.count_jobs("pending") == 3
    done = run(dsn, schema, "cancel", "-q", "a", "--reason", "wrong queue")
    assert done.stdout.strip() == "cancelled 2 pending job(s)"
    assert (client.count_jobs("cancelled"), client.count_jobs("pending")) == (2, 1)
    refused = run(dsn, schema, "cancel", ok=False)
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1

    later = client.enqueue("mail.send", {}, queue="b", delay=3600)
    assert run(dsn, schema, "jobs", "run-now", str(later)).stdout.strip() == f"job {later}: due now"
    job = client.get_job(later)
    assert job is not None and len(client.claim("b", worker="w", limit=5)) == 2  # b1 and it
    assert client.job_events(later)[-1].event == "run_now"
    again = run(dsn, schema, "jobs", "run-now", str(later), ok=False)
    assert again.returncode == 1 and "not a scheduled pending job" in again.stderr

    shown = run(dsn, schema, "jobs", "show", str(b1)).stdout
    assert "None" not in shown, shown
    assert "has no attribute 'ap'" in run(dsn, schema, "worker", "tests.support.apps.newcomer:ap",
                                          ok=False).stderr  # fmt: skip


def test_shell_completion_scripts_are_generated() -> None:
    import os
    import subprocess
    import sys
    from pathlib import Path

    leaseq_script = Path(sys.executable).with_name("leaseq")
    for shell in ("bash", "zsh", "fish"):
        env = {**os.environ, "_LEASEQ_COMPLETE": f"{shell}_source"}
        done = subprocess.run([str(leaseq_script)], env=env, capture_output=True, text=True)
        assert done.returncode == 0 and "_LEASEQ_COMPLETE" in done.stdout, (shell, done.stderr)
