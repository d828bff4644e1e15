"""bench's drains against a real server: every drain is timed on the two clocks issue 20
asks for, the same for every system. The boundary is between the database's clock (first
claim to last completion, read from each system's own tables) and the process wall (spawn
to exit): the first lies inside the second, so a database clock that came out longer than
the wall would mean the query read the wrong rows (another queue's, or none). Break the
clock query, the raw processes' fan-out or the capabilities set-up and these fail."""

from __future__ import annotations

import dataclasses
import pathlib
import subprocess
import sys

import pytest

from bench.harness import REPO_ROOT, SYNC_TASK, Sample, Settings
from bench.scenarios import backlog, drain, minimal, peer_drains, regression, workloads
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


@pytest.mark.parametrize("name", [*(s.name for s in workloads.SCENARIOS), backlog.NAME])
def test_realistic_workload_runs_at_tiny_size_and_reports_every_figure(dsn: str, name: str) -> None:
    # Each realistic workload (I/O-bound handler, payloads, 100 queues, the backlog) does
    # its work (each scenario checks every job succeeded once) and fills every metric it
    # declares, each drain's database clock inside its process wall. No timing asserted.
    small = dataclasses.replace(settings(dsn), backlogs=(500,), claims=20)
    scenario = next(s for s in (*workloads.SCENARIOS, backlog.scenario(500)) if s.name == name)
    samples = scenario.fn(small)
    assert set(samples) == {m.key for m in scenario.metrics}
    assert all(s.jobs > 0 and s.seconds > 0 for s in samples.values())
    for prefix in {k.removesuffix("-db") for k in samples if k.endswith("-db")}:
        db, wall = samples[f"{prefix}-db"], samples[f"{prefix}-wall"]
        assert db.jobs == wall.jobs and db.seconds <= wall.seconds


def test_regression_check_runs_as_a_smoke_test_and_prints_its_ratios(
    dsn: str, tmp_path: pathlib.Path
) -> None:
    # The regression check of the plain drain (issue 35: "runs in CI as a smoke test that
    # prints ratios and never fails on timing"): `python -m bench` at a tiny size, the raw
    # limit, the plain drains and the drain beside capabilities in use elsewhere. It must
    # run and print each plain drain against the stored reference as a ratio to the raw
    # limit of the same run, and the capabilities' ratio; the verdict is printed, not judged.
    only = "drain-raw,drain-leaseq,drain-leaseq-2p,drain-leaseq-sync-2p,drain-elsewhere"
    command = [sys.executable, "-m", "bench", "--dsn", dsn, "--jobs", str(JOBS)]
    command += ["--repeat", "1", "--only", only, "--out", str(tmp_path / "smoke.json")]
    proc = subprocess.run(
        command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300, check=False
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    print(proc.stdout)  # the figures, for whoever reads the CI log
    report = proc.stdout
    assert "regression of the plain drain against the reference of" in report
    for what in ("async 1p", "async 2p", "sync 2p"):
        line = next(x for x in report.splitlines() if x.strip().startswith(f"{what}:"))
        assert "x raw limit (reference" in line
        assert "within budget" in line or "REGRESSED" in line
    assert "drain with capabilities in use elsewhere / plain drain" in report
