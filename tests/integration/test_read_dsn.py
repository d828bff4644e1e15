"""``read_dsn``: inspection reads on a real streaming standby, writes on the primary.

One primary + standby pair for the module (``tests.support.replication.ReplicaPair``, well
under a second to start). The boundary: a standby refuses every write (SQLSTATE 25006), so a write
method, or a read that must see its own writes, that reached the read DSN would fail here;
and with replication cut, a read that went to the replica cannot see what the primary has.
The shared test server serves the cases that need no standby (the read pool's own
read-only sessions, an unreachable read DSN).
"""

from __future__ import annotations

import math
import re
import subprocess
import sys
import warnings
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner

import leaseq
from leaseq.cli import cli
from leaseq.db_metrics import database_registry
from leaseq.errors import DatabaseUnavailable
from leaseq.models import Failure
from tests.support.ports import free_port
from tests.support.replication import ReplicaPair

pytestmark = [pytest.mark.requires("postgres-server")]


@pytest.fixture(scope="module")
def pair() -> Iterator[ReplicaPair]:
    with ReplicaPair() as started:
        leaseq.Client(started.primary_dsn).migrate()
        started.wait_caught_up()
        yield started


@pytest.fixture()
def both(pair: ReplicaPair) -> Iterator[leaseq.Client]:
    """A client writing to the primary and reading inspection from the standby."""
    pair.heal()
    pair.wait_caught_up()
    with leaseq.Client(pair.primary_dsn, read_dsn=pair.standby_dsn) as client:
        yield client
    pair.heal()


def _run(*args: str) -> Any:
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def test_a_write_on_the_standby_fails_with_25006(pair: ReplicaPair) -> None:
    """The premise of every test below: the read DSN takes no writes."""
    with (
        psycopg.connect(pair.standby_dsn, autocommit=True) as conn,
        pytest.raises(psycopg.errors.ReadOnlySqlTransaction),
    ):
        conn.execute("CREATE TABLE nope (x int)")


def test_inspection_reads_come_from_the_replica_and_lag_shows_while_it_is_behind(
    pair: ReplicaPair, both: leaseq.Client
) -> None:
    seen = int(both.enqueue("t", {"n": 1}, queue="lagq"))
    pair.wait_caught_up()
    assert both.get_job(seen) is not None
    assert both.read_replica_lag() == leaseq.ReplicaLag(True, 0, 0.0)
    pair.cut()
    unseen = int(both.enqueue("t", {"n": 2}, queue="lagq"))  # on the primary only
    with leaseq.Client(pair.primary_dsn) as primary:
        assert primary.get_job(unseen) is not None
    # Every inspection read answers from the replica, which has not got it.
    assert both.get_job(unseen) is None
    assert [j.job_id for j in both.list_jobs("pending", queue="lagq")] == [seen]
    assert both.count_jobs("pending", queue="lagq") == 1
    assert [s.ready for s in both.queue_stats() if s.queue == "lagq"] == [1]
    # ...unless the caller asks for its own connection (read-your-writes on the primary).
    with both.connection() as conn:
        assert both.get_job(unseen, connection=conn) is not None
    lag = both.read_replica_lag()
    assert lag is not None and lag.in_recovery and lag.bytes > 0
    assert lag.seconds is not None and lag.seconds > 0
    assert "behind" in lag.describe()
    pair.heal()
    pair.wait_caught_up()
    assert both.get_job(unseen) is not None
    assert both.read_replica_lag() == leaseq.ReplicaLag(True, 0, 0.0)


def test_every_write_method_works_with_read_dsn_on_a_standby(
    pair: ReplicaPair, both: leaseq.Client
) -> None:
    """Each of these would fail with 25006 if it (or a read it relies on) went to the
    standby; replication is cut, so a read-your-writes that went there would see nothing."""
    pair.cut()
    q = "writes"
    ids = [int(r) for r in both.enqueue_many([{"task": "t", "queue": q} for _ in range(3)])]
    first = int(both.enqueue("t", {"a": 1}, queue=q, unique_key="u1"))
    assert int(both.enqueue("t", {"a": 2}, queue=q, unique_key="u1")) == first  # skip: read
    (lease,) = both.claim(q, worker="w", limit=1)
    assert both.heartbeat(lease)
    assert both.effect_start(lease, "mail", "k1")
    assert both.complete(lease)
    assert both.attempts_ended([lease])
    (lease,) = both.claim(q, worker="w", limit=1)
    assert both.release(lease)
    (lease,) = both.claim(q, worker="w", limit=1)
    assert both.fail_many([Failure(lease, "BOOM", retryable=False)])
    dead = lease.job_id
    assert both.replay(dead, reason="again", actor="t")
    assert both.cancel(dead, reason="stop", actor="t")
    assert both.replay(dead, reason="again", actor="t", allow_cancelled=True)
    both.sweep()
    both.age_priorities(interval=60)
    both.prune(older_than=3600)
    assert both.pause(q, reason="maintenance", actor="t")
    assert both.resume(q, actor="t")
    both.set_limit(f"queue:{q}", concurrency=2, actor="t")
    assert both.remove_limit(f"queue:{q}", actor="t")
    both.schedule_add("nightly", task="t", every=3600, reason="r", actor="t")
    both.schedule_change("nightly", every=7200, reason="r", actor="t")
    assert both.schedule_disable("nightly", reason="r", actor="t")
    assert both.schedule_enable("nightly", reason="r", actor="t")
    assert both.schedule_run_now("nightly", reason="r", actor="t")
    both.tick_schedules()
    assert both.schedule_remove("nightly", reason="r", actor="t")
    with both.batch() as batch:
        batch.enqueue("t", queue=q)
    with both.connection() as conn, conn.transaction():
        both.enqueue("t", queue=q, connection=conn)
    both.purge_dead(reason="clean", actor="t")
    (lease,) = both.claim(q, worker="w", limit=1)
    both.complete(lease)
    assert both.result(lease.job_id, timeout=10) is None  # the wait reads the primary
    assert both.migrate() > 0 and both.check_schema() > 0
    with leaseq.Client(pair.primary_dsn) as primary:
        assert primary.get_job(ids[0]) is not None
    assert both.get_job(ids[0]) is None  # the replica never saw any of it


def test_cli_write_commands_work_with_read_dsn_on_a_standby_and_status_shows_the_lag(
    pair: ReplicaPair, both: leaseq.Client
) -> None:
    base = ["--dsn", pair.primary_dsn, "--read-dsn", pair.standby_dsn]
    job = int(_run(*base, "enqueue", "t", "--queue", "cliq").output)
    dead = []
    for i in range(3):  # dead heads of ordering keys: for keys skip, replay and purge
        both.enqueue("t", queue="cliq-dead", ordering_key=f"k{i}")
        (lease,) = both.claim("cliq-dead", worker="w")
        assert both.fail(lease, "BOOM", retryable=False)
        dead.append(lease.job_id)
    pair.cut()  # a write command that read its own writes on the replica would now fail
    for args in (
        ["pause", "cliq", "--reason", "r"],
        ["resume", "cliq"],
        ["limits", "set", "queue:cliq", "--concurrency", "3"],
        ["limits", "remove", "queue:cliq"],
        ["schedules", "add", "cli-s", "--task", "t", "--every", "1h", "--reason", "r"],
        ["schedules", "change", "cli-s", "--every", "2h", "--reason", "r"],
        ["schedules", "disable", "cli-s", "--reason", "r"],
        ["schedules", "enable", "cli-s", "--reason", "r"],
        ["schedules", "run", "cli-s", "--reason", "r"],
        ["schedules", "remove", "cli-s", "--reason", "r"],
        ["cancel", str(job), "--reason", "r"],
        ["replay", str(job), "--reason", "r", "--allow-cancelled"],
        ["keys", "skip", str(dead[0]), "--reason", "r"],
        ["replay", str(dead[1]), "--reason", "r"],
        ["replay", "--queue", "cliq-dead", "--reason", "r"],
        ["dead", "purge", "--queue", "cliq-dead", "--reason", "r"],
        ["sweep"],
        ["prune", "--older-than", "1h"],
        ["migrate"],
    ):
        result = _run(*base, *args)
        assert result.exit_code == 0, (args, result.output)
    pair.heal()
    pair.wait_caught_up()
    shown = _run(*base, "jobs", "show", str(job))
    assert shown.exit_code == 0 and "pending" in shown.output
    status = _run(*base, "status")
    assert status.exit_code == 0, status.output
    assert "cliq" in status.output
    assert status.output.rstrip().splitlines()[-1].startswith("read replica: ")


def test_database_metrics_read_on_the_replica_report_its_lag(
    pair: ReplicaPair, both: leaseq.Client
) -> None:
    def fetch() -> tuple[list[leaseq.QueueStats], dict[str, Any]]:
        return both.queue_stats(), {
            **both.database_health(),
            "replica_lag": both.read_replica_lag(),
        }

    def lag_value() -> float:
        for family in database_registry(fetch).collect():
            if family.name == "leaseq_read_replica_lag_seconds":
                return float(family.samples[0].value)
        raise AssertionError("no leaseq_read_replica_lag_seconds")

    assert lag_value() == 0.0
    pair.cut()
    both.enqueue("t", queue="metricq")
    value = lag_value()
    assert value > 0 or math.isnan(value)


def test_without_read_dsn_there_is_no_lag_metric(client: leaseq.Client) -> None:
    assert client.read_dsn is None and client.read_replica_lag() is None
    names = {
        f.name
        for f in database_registry(
            lambda: (client.queue_stats(), {**client.database_health(), "replica_lag": None})
        ).collect()
    }
    assert "leaseq_read_replica_lag_seconds" not in names


def test_the_read_pool_refuses_writes_even_when_read_dsn_names_a_primary(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    job = int(client.enqueue("t"))
    with leaseq.Client(dsn, schema=schema, read_dsn=dsn) as reads:
        assert reads.get_job(job) is not None
        assert reads.read_replica_lag() == leaseq.ReplicaLag(False, 0, 0.0)
        pool = reads._reads
        assert pool is not None
        with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
            pool.rows("cancel_job", {"id": job, "actor": "t", "reason": None})
    assert (j := client.get_job(job)) is not None and j.status == "pending"


def test_an_unreachable_read_dsn_fails_reads_in_one_line_and_writes_go_on(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    """The choice: fail, never fall back to the primary (the replica is there to spare it)."""
    closed = f"host=127.0.0.1 port={free_port()} dbname=leaseq user=leaseq connect_timeout=2"
    with leaseq.Client(dsn, schema=schema, read_dsn=closed) as both:
        job = int(both.enqueue("t"))  # writes do not need the replica
        with pytest.raises(DatabaseUnavailable, match=r"^cannot connect to the read replica at "):
            both.get_job(job)
        with pytest.raises(DatabaseUnavailable):
            both.read_replica_lag()
        with both.connection() as conn:
            assert both.get_job(job, connection=conn) is not None
        assert both.cancel(job, reason="still works", actor="t")
    result = CliRunner().invoke(
        cli, ["--dsn", dsn, "--schema", schema, "--read-dsn", closed, "status"]
    )
    assert result.exit_code != 0
    assert isinstance(result.exception, DatabaseUnavailable)


def test_cli_with_an_unreachable_read_dsn_says_so_in_one_line(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    closed = f"host=127.0.0.1 port={free_port()} dbname=leaseq user=leaseq connect_timeout=2"
    for command in (["status"], ["metrics", "serve", "--port", "0"], ["dead", "list"]):
        argv = ["--dsn", dsn, "--schema", schema, "--read-dsn", closed, *command]
        done = subprocess.run(
            [sys.executable, "-m", "leaseq", *argv], capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 1, (command, done.stderr)
        (line,) = done.stderr.strip().splitlines()
        assert line.startswith("leaseq: error: cannot connect to the read replica at "), line


def test_the_dashboard_reads_on_the_replica_shows_its_lag_and_acts_on_the_primary(
    pair: ReplicaPair, both: leaseq.Client
) -> None:
    pytest.importorskip("starlette")
    pytest.importorskip("httpx")
    with warnings.catch_warnings():
        # Starlette asks for httpx2 in its test client; httpx works the same here.
        warnings.simplefilter("ignore")
        from starlette.testclient import TestClient

    from leaseq.web import create_app

    job = int(both.enqueue("t", queue="webq"))
    pair.wait_caught_up()
    pair.cut()
    unseen = int(both.enqueue("t", queue="webq"))
    reads = leaseq.AsyncClient(pair.primary_dsn, read_dsn=pair.standby_dsn)
    with TestClient(create_app(reads, close_client=True, allowed_hosts=["testserver"])) as web:
        page = web.get("/")
        assert page.status_code == 200
        assert 'id="replica-lag"' in page.text and "bytes of WAL behind" in page.text
        shown = web.get(f"/jobs/{job}")
        assert shown.status_code == 200
        assert web.get(f"/jobs/{unseen}").status_code == 404  # not replayed yet
        found = re.search(r'name="csrf_token" value="([^"]+)"', shown.text)
        assert found is not None
        form = {"csrf_token": found.group(1), "reason": "from the dashboard"}
        done = web.post(f"/jobs/{job}/cancel", data=form)
        assert done.status_code == 200, done.text
    with leaseq.Client(pair.primary_dsn) as primary:
        assert (j := primary.get_job(job)) is not None and j.status == "cancelled"


def test_with_the_primary_down_status_and_the_dashboard_still_read_the_replica(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    """The replica is what operators look at during an incident: the counts still come,
    and the lag says it is unknown instead of failing the page."""
    client.enqueue("t", queue="still-shown")
    down = f"host=127.0.0.1 port={free_port()} dbname=leaseq user=leaseq connect_timeout=2"
    result = CliRunner().invoke(
        cli, ["--dsn", down, "--read-dsn", dsn, "--schema", schema, "status"]
    )
    assert result.exit_code == 0, result.output
    assert "still-shown" in result.output
    last = result.output.rstrip().splitlines()[-1]
    assert last.startswith("read replica: lag unknown (cannot connect to PostgreSQL at "), last
    pytest.importorskip("starlette")
    pytest.importorskip("httpx")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from starlette.testclient import TestClient

    from leaseq.web import create_app

    reads = leaseq.AsyncClient(down, schema=schema, read_dsn=dsn)
    with TestClient(create_app(reads, close_client=True, allowed_hosts=["testserver"])) as web:
        page = web.get("/")
        assert page.status_code == 200
        assert "still-shown" in page.text and "read replica: lag unknown" in page.text
