"""bench's drains against a real server: every drain is timed on the two clocks issue 20
asks for, the same for every system. The boundary is between the database's clock (first
claim to last completion, read from each system's own tables) and the process wall (spawn
to exit): the first lies inside the second, so a database clock that came out longer than
the wall would mean the query read the wrong rows (another queue's, or none). Break the
clock query, the raw processes' fan-out or the capabilities set-up and these fail."""

from __future__ import annotations

import subprocess

import pytest

from bench.harness import SYNC_TASK, Sample, Settings
from bench.scenarios import drain, minimal, peer_drains, regression
from tests.support.requires import find_tool, missing

pytestmark = pytest.mark.slow

JOBS = 300


def settings(dsn: str) -> Settings:
    return Settings(dsn=dsn, jobs=JOBS, batch=100, concurrency=200, single=1, repeat=1)


def assert_two_clocks(samples: dict[str, Sample], prefix: str) -> None:
    db, wall = samples[f"{prefix}-db"], samples[f"{prefix}-wall"]
    assert db.jobs == wall.jobs == JOBS
    assert 0 < db.seconds <= wall.seconds


def test_raw_drain_processes_share_the_queue_and_are_timed_on_both_clocks(
    dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(drain, "RAW_PROCESSES", (1, 2))
    monkeypatch.setattr(drain, "RAW_BATCHES", (100,))
    samples = drain.drain_raw(settings(dsn))  # checks every job succeeded once
    assert set(samples) == {drain.raw_key(p, 100, c) for p in (1, 2) for c in ("db", "wall")}
    for p in (1, 2):
        assert_two_clocks(samples, drain.raw_key(p, 100, "x")[:-2])


def test_sync_worker_drain_is_timed_on_both_clocks(dsn: str) -> None:
    samples = drain.leaseq_drain(settings(dsn), "drain-leaseq-sync", SYNC_TASK, 1)
    assert_two_clocks(samples, "drain-leaseq-sync")


def test_capabilities_in_use_elsewhere_leave_the_plain_queue_to_drain(dsn: str) -> None:
    # The pause, limit, schedule, unique key and dependency all sit on other queues; the
    # drain and its clock cover the plain queue only (the other queues' jobs stay pending).
    samples = regression.drain_elsewhere(settings(dsn))
    assert_two_clocks(samples, regression.NAME)


def test_pgqueuer_two_processes_are_timed_from_its_log(dsn: str) -> None:
    samples = peer_drains.PGQUEUER_2P.fn(settings(dsn))  # checks every job logged once
    assert_two_clocks(samples, "drain-pgqueuer-2p")


def test_minimal_drain_processes_share_the_seed_table_and_are_timed_on_both_clocks(
    dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The seed's own table and statements, nothing of leaseq's: every job succeeds once
    # (checked by the scenario) and the database clock lies inside the process wall.
    monkeypatch.setattr(minimal, "RAW_PROCESSES", (1, 2))
    monkeypatch.setattr(minimal, "RAW_BATCHES", (100,))
    samples = minimal.drain_minimal(settings(dsn))
    assert set(samples) == {minimal.key(p, 100, c) for p in (1, 2) for c in ("db", "wall")}
    for p in (1, 2):
        assert_two_clocks(samples, minimal.key(p, 100, "x")[:-2])


def test_graphile_worker_batched_drain_runs_every_job_once_on_both_clocks(dsn: str) -> None:
    # graphile-worker's own migrations, add_jobs and runOnce in two Node.js processes: every
    # handler runs once (counted by the processes), its table ends empty (checked by the
    # scenario), and its own timer lies inside the process wall.
    from bench.scenarios import graphile

    if find_tool("node") is None or find_tool("npm") is None:
        missing("node and npm not installed (Debian: apt-get install nodejs npm)")
    if not (graphile.PEER_DIR / "node_modules" / "graphile-worker").is_dir():
        subprocess.run(
            ["npm", "ci", "--no-audit", "--no-fund"], cwd=graphile.PEER_DIR, check=True, timeout=300
        )
    samples = graphile.drain_graphile(settings(dsn), "batched", 2)
    assert_two_clocks(samples, "drain-graphile-batched-2p")
