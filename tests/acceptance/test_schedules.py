"""Schedules across real worker processes: eight tickers racing on one-second ticks make
exactly one job per tick, without gaps, through a kill -9 of one of them and its restart."""

from __future__ import annotations

import datetime as dt
import itertools
import json
import os
import pathlib
import signal
import subprocess
import sys

import pytest

import leaseq
from leaseq.params import notify_channel
from leaseq.rules.schedules import parse_tick_key
from leaseq.worker.listener import LISTENER_APPLICATION_NAME
from tests.support.helpers import rows
from tests.support.procs import ROOT, WorkerProcess, wait_for


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_eight_tickers_make_one_job_per_tick_through_a_kill_9(
    dsn: str, schema: str, client: leaseq.Client, tmp_path: pathlib.Path
) -> None:
    # The tick jobs go to a queue no worker serves, so every one of them stays countable.
    client.schedule_add("pulse", task="noop", every=1, catch_up="all", queue="ticks")

    def ticks() -> int:
        return int(rows(dsn, "SELECT count(*) FROM {s}.schedule_ticks", schema)[0][0])

    def start() -> WorkerProcess:
        return WorkerProcess(dsn, schema, "--poll-interval", "1", log_dir=tmp_path)

    def listening() -> int:
        """Workers of this schema that are up: each holds a LISTEN connection."""
        return int(
            rows(
                dsn,
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE application_name = %s AND query LIKE %s",
                schema,
                LISTENER_APPLICATION_NAME,
                f"LISTEN %{notify_channel(schema)}%",
            )[0][0]
        )

    def more_ticks(count: int, what: str) -> int:
        # Ticks come once a second: wait for the condition, not for a fixed total.
        want = ticks() + count
        wait_for(lambda: ticks() >= want, 60, what)
        return want

    workers = [start() for _ in range(8)]
    try:
        wait_for(lambda: listening() == 8, 90, "eight workers up")
        more_ticks(5, "ticks with all eight tickers racing")
        victim = workers[3]
        victim.signal(signal.SIGKILL)
        victim.wait(10)
        victim.kill()
        wait_for(lambda: listening() == 7, 30, "the killed worker's connections to end")
        more_ticks(2, "ticks without the killed worker")
        workers[3] = start()
        wait_for(lambda: listening() == 8, 90, "the restarted worker up")
        least = more_ticks(5, "ticks with the restarted worker racing again")
    finally:
        for worker in workers:
            worker.kill()
    found = rows(
        dsn,
        "SELECT t.tick_at, t.job_id, t.skipped, j.idempotency_key, j.queue_name"
        " FROM {s}.schedule_ticks t LEFT JOIN {s}.jobs j ON j.id = t.job_id"
        " ORDER BY t.tick_at",
        schema,
    )
    assert len(found) >= least
    # exactly one job per tick: every tick row has its job, no job without its tick
    assert all(job_id is not None and skipped is None for _, job_id, skipped, _, _ in found)
    ((jobs,),) = rows(dsn, "SELECT count(*) FROM {s}.jobs", schema)
    assert jobs == len(found)
    assert len({job_id for _, job_id, _, _, _ in found}) == len(found)
    # no gaps: one tick per second from the first to the last
    instants = [tick_at for tick_at, *_ in found]
    assert all(b - a == dt.timedelta(seconds=1) for a, b in itertools.pairwise(instants))
    # each job says which tick it is
    for tick_at, _, _, key, queue in found:
        tick = parse_tick_key(key)
        assert tick is not None and tick.name == "pulse" and tick.scheduled_for == tick_at
        assert queue == "ticks"


def test_schedules_cli_add_list_run_disable_remove_with_json_and_one_line_errors(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    def run(*args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
        env = dict(os.environ, LEASEQ_DSN=dsn)
        result = subprocess.run(
            [sys.executable, "-m", "leaseq", "--schema", schema, "schedules", *args],
            env=env,
            capture_output=True,
            encoding="utf-8",
            timeout=120,
            cwd=ROOT,
        )
        assert (result.returncode == 0) == ok, result.stderr
        assert "Traceback" not in result.stderr
        return result

    added = json.loads(
        run("add", "nightly", "--task", "noop", "--cron", "30 2 * * *", "--tz",
            "Europe/Berlin", "--payload", '{"k": 1}', "--overlap", "skip", "--json").stdout
    )  # fmt: skip
    assert added["tz"] == "Europe/Berlin" and added["payload"] == {"k": 1}
    assert "nightly" in run("list").stdout
    ran = json.loads(run("run", "nightly", "--reason", "test", "--json").stdout)
    listed = json.loads(run("list", "--json").stdout)
    assert listed[0]["last_job_id"] == ran["job_id"]
    assert listed[0]["last_job_status"] == "pending"
    (tick,) = json.loads(run("ticks", "nightly", "--json").stdout)
    assert tick["job_id"] == ran["job_id"] and tick["manual"]
    assert "manual" in run("ticks", "nightly").stdout
    assert json.loads(run("disable", "nightly", "--reason", "r", "--json").stdout)["changed"]
    assert "already disabled" in run("disable", "nightly", "--reason", "r").stdout
    run("change", "nightly", "--every", "1h")
    assert client.schedules("nightly")[0].definition.timing.every == 3600.0
    for bad in (
        ("add", "x", "--task", "noop", "--cron", "99 * * * *"),
        ("add", "x", "--task", "noop"),
        ("add", "x", "--task", "noop", "--cron", "* * * * *", "--tz", "Mars/Base"),
        ("add", "nightly", "--task", "noop", "--every", "5s"),
        ("run", "missing"),
        ("enable", "missing", "--reason", "r"),
    ):
        err = run(*bad, ok=False).stderr
        assert err.count("\n") == 1 and err.startswith("leaseq: error:"), err
    run("remove", "nightly", "--reason", "done")
    assert json.loads(run("list", "--json").stdout) == []
    actions = [e.action for e in client.admin_events(scope="schedule", value="nightly")]
    assert actions == [
        "schedule.remove",
        "schedule.change",
        "schedule.disable",
        "schedule.run",
        "schedule.add",
    ]
