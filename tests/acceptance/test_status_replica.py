"""``leaseq status`` with ``--read-dsn``, as an operator runs it (``python -m leaseq``) against
a real streaming standby (``tests.support.replication.ReplicaPair``).

The boundary: the reads go to the standby, so with replication cut the primary's newest
jobs are missing from the counts; the output must then say which server answered and how far
it is behind, by the same reading as ``leaseq_read_replica_lag_seconds``. Without a read DSN
nothing is added; with the primary down the counts still come and the lag is unknown.
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

import leaseq
from leaseq.db_metrics import database_registry
from leaseq.dsn import describe_dsn
from tests.support.ports import free_port
from tests.support.replication import HOST, ReplicaPair

pytestmark = [pytest.mark.slow, pytest.mark.requires("postgres-server")]

ROOT = pathlib.Path(__file__).resolve().parents[2]
#: What every queue's entry in ``status --json`` has always carried.
# Per queue, status --json adds "paused" and (durable execution) "suspended" to QueueStats.
QUEUE_KEYS = {*leaseq.QueueStats("q", 0, 0, 0, 0, 0.0, 0.0, 0).as_dict(), "paused", "suspended"}


def leaseq_cli(*args: str) -> str:
    """``python -m leaseq ARGS`` in a process of its own; its stdout (it must succeed)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEASEQ_")}
    result = subprocess.run(
        [sys.executable, "-m", "leaseq", *args],
        env=env,
        capture_output=True,
        encoding="utf-8",
        timeout=120,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    return result.stdout


def status_json(*args: str) -> list[dict[str, Any]]:
    found = json.loads(leaseq_cli(*args, "status", "--json"))
    assert isinstance(found, list)
    return found


def metric_lag(client: leaseq.Client) -> float:
    """leaseq_read_replica_lag_seconds as ``metrics serve`` computes it."""

    def fetch() -> tuple[list[leaseq.QueueStats], dict[str, Any]]:
        return [], {**client.database_health(), "replica_lag": client.read_replica_lag()}

    for family in database_registry(fetch).collect():
        if family.name == "leaseq_read_replica_lag_seconds":
            return float(family.samples[0].value)
    raise AssertionError("no leaseq_read_replica_lag_seconds")


@pytest.fixture(scope="module")
def pair() -> Iterator[ReplicaPair]:
    with ReplicaPair() as started:
        leaseq.Client(started.primary_dsn).migrate()
        started.wait_caught_up()
        yield started


def test_status_names_the_standby_that_answered_and_its_lag_as_the_metric_reads_it(
    pair: ReplicaPair,
) -> None:
    base = ("--dsn", pair.primary_dsn, "--read-dsn", pair.standby_dsn)
    standby = f"{HOST}:{pair.standby_port}"
    with leaseq.Client(pair.primary_dsn, read_dsn=pair.standby_dsn) as both:
        both.enqueue("t", queue="seenq")
        pair.wait_caught_up()

        (entry,) = status_json(*base)
        assert entry["queue"] == "seenq" and entry["ready"] == 1
        assert set(entry) == QUEUE_KEYS | {"read_replica"}, "keys are added, none renamed"
        assert entry["read_replica"] == {
            "read_dsn": describe_dsn(pair.standby_dsn),
            "server": standby,
            "in_recovery": True,
            "lag_seconds": 0.0,
            "lag_bytes": 0,
            "error": None,
        }
        assert metric_lag(both) == 0.0
        lines = leaseq_cli(*base, "status").rstrip().splitlines()
        assert lines[-2] == f"reads from: {standby} (read DSN {describe_dsn(pair.standby_dsn)})"
        assert lines[-1] == "read replica: caught up (lag 0s)"

        pair.cut()  # the standby stops receiving: what the primary commits now, it lacks
        try:
            both.enqueue("t", queue="seenq")
            both.enqueue("t", queue="unseenq")
            entries = status_json(*base)
            # The counts are the standby's: one job in seenq, nothing of unseenq.
            assert [(e["queue"], e["ready"]) for e in entries] == [("seenq", 1)]
            replica = entries[0]["read_replica"]
            assert replica["server"] == standby and replica["error"] is None
            assert replica["in_recovery"] is True and replica["lag_bytes"] > 0
            # Behind: the age of the newest transaction it replayed, > 0, as the metric.
            assert replica["lag_seconds"] is not None and replica["lag_seconds"] > 0
            after = metric_lag(both)
            assert after > 0 and not math.isnan(after)
            assert replica["lag_seconds"] <= after, "read first, so no older than the metric"
            last = leaseq_cli(*base, "status").rstrip().splitlines()[-1]
            assert last.startswith("read replica: lag ") and last.endswith("bytes of WAL behind")
        finally:
            pair.heal()
        pair.wait_caught_up()
        (entry,) = [e for e in status_json(*base) if e["queue"] == "unseenq"]
        assert entry["read_replica"]["lag_bytes"] == 0


def test_without_a_read_dsn_status_says_nothing_new(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    client.enqueue("t", queue="plainq")
    (entry,) = status_json("--dsn", dsn, "--schema", schema)
    assert set(entry) == QUEUE_KEYS
    out = leaseq_cli("--dsn", dsn, "--schema", schema, "status")
    assert "plainq" in out
    assert "read replica" not in out and "reads from" not in out


def test_with_the_primary_down_status_json_answers_from_the_replica_lag_unknown(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    """During an incident the replica is what operators read: counts still come, the lag
    and the server that answered it are unknown, and the reason is one line."""
    replica = dsn  # the shared test server stands in for the replica here
    client.enqueue("t", queue="still-counted")
    down = f"host={HOST} port={free_port()} dbname=leaseq user=leaseq connect_timeout=2"
    base = ("--dsn", down, "--read-dsn", replica, "--schema", schema)
    (entry,) = status_json(*base)
    assert entry["queue"] == "still-counted" and entry["ready"] == 1
    report = entry["read_replica"]
    assert report["read_dsn"] == describe_dsn(replica)
    assert (report["server"], report["lag_seconds"], report["lag_bytes"]) == (None, None, None)
    assert report["error"].startswith("cannot connect to PostgreSQL at "), report
    lines = leaseq_cli(*base, "status").rstrip().splitlines()
    assert lines[-2] == f"reads from: read DSN {describe_dsn(replica)}"
    assert lines[-1].startswith("read replica: lag unknown (")
