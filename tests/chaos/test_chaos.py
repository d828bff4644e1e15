"""The chaos run, bounded for CI: 1,000 plain jobs and every capability's workload
(tests/chaos/caps/), 3 worker processes, a 30 s window of seeded faults (kill -9, SIGSTOP
past the lease, pg_terminate_backend, PostgreSQL restarts, a shutdown's release, dropped,
stalled and half-open connections), then the invariant checks of tests/chaos/harness.py and
of each capability (sampled every 100 ms during the run, and at the end).

The fixed seed always runs. More seeds: ``LEASEQ_CHAOS_SEEDS=random`` (one random seed,
printed) or ``LEASEQ_CHAOS_SEEDS=12,34``. Longer runs by hand: ``python -m tests.chaos``.
A failure names its seed and the command that replays the same fault schedule.
"""

from __future__ import annotations

import os
import random
from collections import Counter
from typing import cast

import pytest

from tests.chaos.harness import (
    CHECKS,
    KINDS,
    ChaosConfig,
    Execution,
    _Proc,
    check,
    fingerprint,
    make_schedule,
    run_chaos,
)
from tests.support.procs import WorkerProcess

FIXED_SEED = 20261202


def _seeds() -> list[int]:
    seeds = [FIXED_SEED]
    for item in os.environ.get("LEASEQ_CHAOS_SEEDS", "").split(","):
        item = item.strip()
        if item == "random":
            seeds.append(random.SystemRandom().randrange(2**31))
        elif item:
            seeds.append(int(item))
    return seeds


def _ci_config(seed: int) -> ChaosConfig:
    return ChaosConfig(seed=seed, jobs=1000, workers=3, concurrency=12, seconds=30.0)


@pytest.mark.slow
@pytest.mark.requires("postgres-server")
@pytest.mark.timeout(300)
@pytest.mark.parametrize("seed", _seeds())
def test_chaos_run_keeps_every_invariant(seed: int) -> None:
    config = _ci_config(seed)
    print(f"\nchaos seed {seed}; replay: {config.command()}")
    report = run_chaos(config)
    report.assert_ok()
    # The run proved something only if it was disturbed, and the disturbance showed.
    assert sum(report.applied.values()) >= 10, f"seed {seed}: too few faults applied"
    assert report.duplicate_attempts > 0, f"seed {seed}: no execution was ever disturbed"
    assert report.applied["shutdown"] > 0, f"seed {seed}: no shutdown released anything"


def test_the_schedule_is_a_function_of_the_seed() -> None:
    def schedule(seed: int) -> tuple[object, ...]:
        return make_schedule(seed, seconds=30.0, workers=3, lease=1.5, sweep=0.5, gap=1.2)

    first = schedule(FIXED_SEED)
    assert first == schedule(FIXED_SEED)
    assert fingerprint(first) == fingerprint(schedule(FIXED_SEED))
    assert first != schedule(FIXED_SEED + 1)
    assert _ci_config(FIXED_SEED).schedule() == first
    for seed in [FIXED_SEED, *range(50)]:
        faults = make_schedule(seed, seconds=30.0, workers=3, lease=1.5, sweep=0.5, gap=1.2)
        assert {f.kind for f in faults} == set(KINDS), f"seed {seed}: not every kind"
        for f in faults:
            if f.kind == "stop":
                assert f.hold > 1.5 + 0.5, "a stopped worker must outlive its lease and a sweep"
        # Never two faults on one worker process, or on one proxy, at the same time.
        for kinds in (("kill", "stop", "shutdown"), ("drop", "stall", "half_open")):
            busy: dict[int, float] = {}
            for f in (f for f in faults if f.kind in kinds):
                assert busy.get(f.slot, 0.0) <= f.at, f"seed {seed}: overlapping {f}"
                busy[f.slot] = f.at + f.hold


def test_the_checks_can_fail() -> None:
    """The checker is not vacuous: each invariant, broken on purpose, is reported."""
    config = ChaosConfig(seed=1, jobs=4)
    # id, status, lease_token, attempts, max_attempts, last_error_code, seq, mode
    jobs = [
        (1, "succeeded", 2, 2, 25, None, 0, "ok"),
        (2, "succeeded", 3, 3, 25, None, 1, "ok"),
        (3, "running", 1, 1, 25, None, 2, "ok"),
        (4, "dead", 1, 1, 25, "OperationalError", 3, "ok"),
    ]
    rows = [(1, 1, "w1", 11), (2, 3, "w2", 12), (2, 3, "w2", 12), (4, 1, "w1", 11)]
    executions = [
        Execution(1, 1, 11, "w1", 100.0, tx=100.5, end=100.6, outcome="committed"),
        Execution(1, 2, 12, "w2", 100.2, tx=100.3, end=100.4, outcome="committed"),
        Execution(2, 2, 11, "w1", 200.0, tx=None, end=210.0, outcome="cancelled"),
        Execution(2, 3, 12, "w2", 202.0, tx=209.0, end=209.5, outcome="committed"),
    ]
    result = check(config, jobs, rows, executions, procs={})
    found = {name: len(v) for name, v in result["violations"].items()}
    assert all(found[name] for name in CHECKS), result["violations"]
    assert result["duplicate_attempts"] == 2
    assert Counter(o.job for o in result["overlaps"]) == {1: 1, 2: 1}
    (late,) = [o for o in result["overlaps"] if o.job == 2]
    assert (late.seconds, late.stale_work, late.early_in_tx) == (7.5, 7.5, 0.0)


def test_time_blocked_in_the_fenced_transaction_counts_only_when_strict() -> None:
    """A stale handler blocked in its fenced transaction (its commit will be refused) is
    measured, and held to the bound only with strict_window; frozen time never counts."""
    jobs = [(1, "succeeded", 2, 2, 25, None, 0, "ok")]
    rows = [(1, 2, "w2", 12)]
    executions = [
        Execution(1, 1, 11, "w1", 100.0, tx=100.25, end=106.0, outcome="lease_lost"),
        Execution(1, 2, 12, "w2", 102.0, tx=105.5, end=105.75, outcome="committed"),
    ]
    lenient = check(ChaosConfig(seed=1, jobs=1), jobs, rows, executions, procs={})
    assert not any(lenient["violations"].values()), lenient["violations"]
    (o,) = lenient["overlaps"]
    assert (o.seconds, o.stale_work, o.early_in_tx) == (3.75, 0.0, 5.75)
    strict = ChaosConfig(seed=1, jobs=1, strict_window=True)
    assert check(strict, jobs, rows, executions, procs={})["violations"][CHECKS[3]]

    frozen = _Proc(slot=0, worker=cast(WorkerProcess, None), started=0.0, stops=[[101.0, 106.0]])
    executions[0] = Execution(1, 1, 11, "w1", 100.0, tx=None, end=106.5, outcome="lease_lost")
    result = check(strict, jobs, rows, executions, procs={11: frozen})
    assert not any(result["violations"].values()), "a SIGSTOPped process is not running"
    assert result["overlaps"] == []
