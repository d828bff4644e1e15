"""The failover chaos run (tests/chaos/failover.py), bounded for CI: a real Patroni cluster, in
asynchronous and in synchronous mode, a switchover and a hard failover under load; then the
HA invariants. Longer runs by hand: ``python -m tests.chaos failover --minutes 10 --sync``.

The checker itself is tested first, on made-up rows: each invariant it must catch.
"""

from __future__ import annotations

import dataclasses
import pathlib

import pytest

from tests.chaos.failover import (
    Enqueued,
    Exec,
    FailoverConfig,
    FailoverReport,
    check,
    make_schedule,
    read_execs,
    run_failover,
)

FIXED_SEED = 20261203

ASYNC = FailoverConfig(seed=1, synchronous=False)
SYNC = FailoverConfig(seed=1, synchronous=True)


def _committed(job: int, token: int, start: float, owner: str = "w/n0.1") -> Exec:
    return Exec(job, token, 10, start, start + 0.1, "committed", owner=owner)


def test_a_clean_run_passes() -> None:
    jobs = [(1, "succeeded", 1, 0), (2, "succeeded", 2, 1)]
    execs = [
        _committed(1, 1, 1.0, "w/n0.1"),
        Exec(2, 1, 11, 1.0, 1.2, "lease_lost", owner="v/n1.1"),
        _committed(2, 2, 3, "w/n0.2"),
    ]
    rows = [(1, 1, "w/n0.1", 1.0), (2, 2, "w/n0.2", 3.0)]
    found = check(SYNC, jobs, rows, execs, [Enqueued(1, 0, 0), Enqueued(2, 1, 0)], [])
    assert (found["lost"], found["stale_success"], found["double_effects"]) == ([], [], [])
    assert found["reappeared"] == [] and found["duplicates"] == 1


def test_a_returned_enqueue_that_is_gone_is_lost_except_just_before_an_async_crash() -> None:
    jobs = [(1, "succeeded", 1, 99)]  # id 1 was handed out again, to seq 99
    enqueued = [Enqueued(1, 0, returned=100.0)]
    assert len(check(ASYNC, jobs, [], [], enqueued, [105.0])["lost_enqueues"]) == 1
    assert len(check(ASYNC, jobs, [], [], enqueued, [105.0])["lost"]) == 0
    assert len(check(ASYNC, jobs, [], [], enqueued, [200.0])["lost"]) == 1  # long before
    assert len(check(SYNC, jobs, [], [], enqueued, [105.0])["lost"]) == 1  # never in sync


def test_a_job_left_running_is_lost() -> None:
    found = check(ASYNC, [(1, "running", 3, 0)], [], [], [Enqueued(1, 0, 0)], [])
    assert found["lost"] == ["job 1 (seq 0) is running at the end"]


def test_an_effect_under_a_stale_token_or_without_success_is_a_stale_success() -> None:
    jobs = [(1, "succeeded", 2, 0), (2, "dead", 1, 1)]
    found = check(ASYNC, jobs, [(1, 1, "w/n0.1", 1.0), (2, 1, "w/n0.2", 1.0)], [], [], [])
    assert len(found["stale_success"]) == 2


def test_an_effect_by_the_stale_holder_of_a_reissued_token_is_a_stale_success() -> None:
    """A lost claim: the new primary issued token 1 again, to another execution — here in
    the same process (pid 10 both times). The owners differ (one per claim), and the
    effect row must be the later execution's; the first one's fenced commit must have
    failed."""
    jobs = [(1, "succeeded", 1, 0)]
    execs = [_committed(1, 1, 1.0, "w/n0.7"), _committed(1, 1, 5.0, "w/n0.9")]
    assert {ex.pid for ex in execs} == {10}
    stale_row = [(1, 1, "w/n0.7", 1.0)]
    assert len(check(ASYNC, jobs, stale_row, execs, [], [])["stale_success"]) == 1
    assert check(ASYNC, jobs, [(1, 1, "w/n0.9", 5.0)], execs, [], [])["stale_success"] == []


def test_the_execution_log_keeps_two_claims_of_one_token_in_one_process_apart(
    tmp_path: pathlib.Path,
) -> None:
    """What the chaos app writes (tests/chaos/app.py), read back: same job, token and pid,
    two owners, so two executions (the first one lost its lease)."""
    lines = [
        ("S", 1, 1, 10, "w/n0.7", "1.000000"),
        ("E", 1, 1, 10, "w/n0.7", "1.000000", "-", "1.500000", "lease_lost", ""),
        ("S", 1, 1, 10, "w/n0.9", "5.000000"),
        ("E", 1, 1, 10, "w/n0.9", "5.000000", "5.100000", "5.200000", "committed", ""),
    ]
    text = "".join("\t".join(str(f) for f in line) + "\n" for line in lines)
    (tmp_path / "exec-10.log").write_text(text)
    found = sorted(read_execs(tmp_path), key=lambda ex: ex.start)
    assert [(ex.owner, ex.outcome) for ex in found] == [
        ("w/n0.7", "lease_lost"),
        ("w/n0.9", "committed"),
    ]


def test_two_effect_rows_of_one_job_are_a_double_effect() -> None:
    two = [(1, 2, "w/n0.1", 1.0), (1, 2, "v/n1.1", 2.0)]
    found = check(ASYNC, [(1, "succeeded", 2, 0)], two, [], [], [])
    assert len(found["double_effects"]) == 1


def test_an_acknowledged_completion_that_runs_again_reappeared() -> None:
    jobs = [(1, "succeeded", 2, 0)]
    execs = [_committed(1, 1, 1.0, "w/n0.1"), _committed(1, 2, 5.0, "w/n0.2")]
    found = check(SYNC, jobs, [(1, 2, "w/n0.2", 5.0)], execs, [Enqueued(1, 0, 0)], [])
    assert len(found["reappeared"]) == 1
    report_sync = _report(SYNC, found)
    assert not report_sync.ok and report_sync.violations["reappeared"]
    assert _report(ASYNC, found).ok  # measured, not a violation, in async mode


def _report(cfg: FailoverConfig, found: dict[str, object]) -> FailoverReport:
    return FailoverReport(
        config=cfg, switchovers=0, hard=0, workers_restarted=0, enqueue_errors=0, **found
    )  # type: ignore[arg-type]


def test_the_schedule_is_a_function_of_the_seed_with_both_kinds() -> None:
    a = make_schedule(5, 600, (3, 10))
    assert a == make_schedule(5, 600, (3, 10)) != make_schedule(6, 600, (3, 10))
    assert {kind for _, kind, _lag in a[:2]} == {"switchover", "hard"}
    assert all(lag == 0 for _, _, lag in a)  # no lag asked for
    lagged = make_schedule(5, 600, (3, 10), (0.2, 1.5))
    assert all((0.2 <= lag <= 1.5) == (kind == "hard") for _, kind, lag in lagged)


def _ci_config(synchronous: bool) -> FailoverConfig:
    return FailoverConfig(
        seed=FIXED_SEED, jobs=800, seconds=35.0, synchronous=synchronous, gap=(2.0, 4.0)
    )


@pytest.mark.slow
@pytest.mark.requires("postgres-server", "patroni", "etcd")
@pytest.mark.timeout(300)
@pytest.mark.parametrize("synchronous", [False, True], ids=["async", "sync"])
def test_failover_run_keeps_the_ha_invariants(synchronous: bool) -> None:
    config = _ci_config(synchronous)
    print(f"\nreplay: {config.command()}")
    report = run_failover(config)
    assert report.ok, report.line() + "\n" + report.details()
    assert report.switchovers >= 1 and report.hard >= 1, report.line()
    assert report.workers_restarted == 0, report.details()  # they followed every failover
    assert report.jobs >= 400, report.line()  # enough load went through the failovers


def test_the_ci_configuration_fits_both_kinds_in_its_window() -> None:
    for synchronous in (False, True):
        cfg = _ci_config(synchronous)
        kinds = [kind for at, kind, _lag in cfg.schedule() if at < cfg.seconds]
        assert {"switchover", "hard"} <= set(kinds)
    assert dataclasses.replace(_ci_config(True), seconds=1).schedule() == ()
    kinds = [kind for at, kind, _lag in PARTITIONED.schedule() if at < PARTITIONED.seconds]
    assert {"switchover", "hard", "partition"} <= set(kinds)
    assert "partition" not in {kind for _, kind, _lag in _ci_config(True).schedule()}


#: Round 2: three nodes, synchronous_mode_strict, and a worker host (a network namespace)
#: cut off from the primary while it holds leases.
PARTITIONED = FailoverConfig(
    seed=FIXED_SEED,
    jobs=800,
    seconds=60.0,
    synchronous=True,
    strict=True,
    nodes=3,
    workers=2,
    host_workers=1,
    partition=12.0,
    gap=(2.0, 4.0),
)


@pytest.mark.slow
@pytest.mark.requires("postgres-server", "patroni", "etcd", "root", "ip")
@pytest.mark.timeout(420)
def test_three_strict_nodes_and_a_partitioned_worker_host_keep_the_ha_invariants() -> None:
    print(f"\nreplay: {PARTITIONED.command()}")
    report = run_failover(PARTITIONED)
    assert report.ok, report.line() + "\n" + report.details()
    assert report.switchovers >= 1 and report.hard >= 1, report.line()
    assert report.partitions >= 1 and report.held >= 1, report.line()
    # The sweepers took over what the cut-off host held: its late writes were refused
    # (no stale success, no double effect) and nothing was lost.
    assert report.taken_over >= 1, report.details()
    assert report.workers_restarted == 0, report.details()
    assert report.jobs >= 400, report.line()
