"""bench's scenario catalog after the split into one module per scenario: the boundary
is between the scenario modules (each declares its metrics and ratios) and the catalog
that puts them together. Break it (a duplicated key, a ratio naming a metric no scenario
reports, a raw scenario no longer next to its twin) and these fail; no database needed."""

from __future__ import annotations

import pytest

from bench import summary
from bench.catalog import build_ratios, build_scenarios
from bench.harness import WORKER_LINE, Metric, Ratio, Sample, Series, round_ratios, select_scenarios
from bench.probe import ProbeResult
from bench.scenarios import minimal, regression
from bench.scenarios.drain import RAW_LIMIT, best_raw, finish_raw, raw_key

BACKLOG_SHAPES = [(10_000, 100_000, 1_000_000), (1000, 2000), (5,)]


@pytest.mark.parametrize("backlogs", BACKLOG_SHAPES)
def test_every_metric_key_is_unique_and_every_ratio_names_reported_metrics(
    backlogs: tuple[int, ...],
) -> None:
    scenarios = build_scenarios(backlogs)
    keys = [m.key for s in scenarios for m in s.metrics]
    assert len(keys) == len(set(keys))
    assert all(m.scenario == s.name for s in scenarios for m in s.metrics)
    for ratio in build_ratios(backlogs):
        assert ratio.numerator in keys and ratio.denominator in keys, ratio.label


def test_raw_scenarios_run_right_before_their_leaseq_twins() -> None:
    names = [s.name for s in build_scenarios()]
    for raw, twin in (
        ("enqueue-single-raw", "enqueue-single"),
        ("enqueue-bulk-raw", "enqueue-bulk"),
    ):
        assert names.index(twin) == names.index(raw) + 1
    # the two limits, then each process count: pgqueuer, leaseq async, leaseq sync
    assert names[:8] == [
        "drain-raw",
        "drain-minimal",
        "drain-pgqueuer",
        "drain-leaseq",
        "drain-leaseq-sync",
        "drain-pgqueuer-2p",
        "drain-leaseq-2p",
        "drain-leaseq-sync-2p",
    ]


def test_only_keeps_the_canonical_order_whatever_the_order_asked() -> None:
    chosen = select_scenarios(["enqueue-*", "drain-raw"], build_scenarios())
    assert [s.name for s in chosen][:3] == ["drain-raw", "enqueue-single-raw", "enqueue-single"]
    with pytest.raises(SystemExit):
        select_scenarios(["no-such-scenario"], build_scenarios())


def test_default_run_leaves_the_heavy_scenarios_to_only() -> None:
    default = {s.name for s in select_scenarios([], build_scenarios())}
    assert {"drain-raw", "drain-leaseq-sync-2p", "drain-pgqueuer-2p", "drain-elsewhere"} <= default
    assert not default & {"claim-vs-backlog", "scale-8p", "scale-100q", "drain-procrastinate"}
    assert len(select_scenarios(["all"], build_scenarios())) == len(build_scenarios())


def raw_series(medians: dict[str, list[float]]) -> dict[str, Series]:
    """Series of the drain-raw and drain-minimal scenarios with the given per-round rates (1
    job per sample)."""
    series = {m.key: Series(m) for s in build_scenarios()[:2] for m in s.metrics}
    for key, rates in medians.items():
        series[key].samples = [Sample(1, 1.0 / r) for r in rates]
    return series


def test_raw_limit_is_the_best_configuration_by_median_per_clock() -> None:
    # One lucky round must not win: the 2-process config has the best single sample, the
    # 4-process one the best median. The wall clock has a winner of its own.
    series = raw_series(
        {
            raw_key(2, 100, "db"): [100.0, 10.0, 10.0],
            raw_key(4, 100, "db"): [20.0, 20.0, 20.0],
            raw_key(1, 10, "db"): [5.0, 5.0, 5.0],
            raw_key(1, 100, "wall"): [9.0, 9.0, 9.0],
            raw_key(4, 100, "wall"): [3.0, 3.0, 3.0],
        }
    )
    assert best_raw(series, "db") == raw_key(4, 100, "db")
    finish_raw(series)
    assert series[f"{RAW_LIMIT}-db"].figures() == [20.0, 20.0, 20.0]
    assert series[f"{RAW_LIMIT}-wall"].figures() == [9.0, 9.0, 9.0]
    assert "4 processes, batch 100" in series[f"{RAW_LIMIT}-db"].metric.label
    assert "1 process, batch 100" in series[f"{RAW_LIMIT}-wall"].metric.label
    # every leaseq ratio then divides by the winner of the same round and clock
    leaseq = Series(Metric("drain-leaseq-db", "drain-leaseq", "x"), [Sample(1, 1 / 10.0)] * 3)
    series["drain-leaseq-db"] = leaseq
    assert round_ratios(series, Ratio("r", "drain-leaseq-db", f"{RAW_LIMIT}-db")) == [0.5] * 3
    table = summary.markdown(series)
    assert (
        "**own-statements limit (excl.)**" in table
        and "4 processes, one connection each, batch 100" in table
    )


def test_regression_note_flags_a_drop_beyond_the_budget() -> None:
    series = raw_series({raw_key(1, 100, "db"): [100.0]})
    finish_raw(series)
    series["drain-leaseq-db"] = Series(
        Metric("drain-leaseq-db", "drain-leaseq", "x"), [Sample(1, 1 / 50.0)]
    )
    ref = {
        "when": "then",
        "git": "abc",
        "drains": {"drain-leaseq-db": {"jobs_s": 60.0, "vs_raw_limit": 0.5}},
    }
    assert "within budget" in "\n".join(regression.reference_lines(series, ref))
    ref["drains"]["drain-leaseq-db"]["vs_raw_limit"] = 0.52  # now 0.50: -3.8%
    assert "REGRESSED" in "\n".join(regression.reference_lines(series, ref))


def test_inverse_ratio_turns_two_rates_into_a_time_ratio() -> None:
    fast, slow = Metric("a", "s", "a"), Metric("b", "s", "b")
    series = {
        "a": Series(fast, [Sample(100, 1.0)]),  # 100/s
        "b": Series(slow, [Sample(100, 2.0)]),  # 50/s: each takes twice as long
    }
    assert round_ratios(series, Ratio("t", "b", "a", inverse=True)) == [2.0]
    assert round_ratios(series, Ratio("r", "b", "a")) == [0.5]
    assert round_ratios(series, Ratio("x", "b", "missing")) is None


def test_worker_summary_line_is_parsed() -> None:
    # The wording `leaseq worker --burst` prints (leaseq/cli/worker.py); bench depends on it.
    line = "processed 500 job(s) in 0.25s (2008/s): 500 succeeded, 0 failed, 0 lost lease(s)"
    match = WORKER_LINE.search(line)
    assert match is not None
    assert (match["jobs"], match["rate"], match["succeeded"]) == ("500", "2008", "500")


def test_probe_cpu_covers_the_drain_only_and_survives_an_early_exit() -> None:
    # The timeline holds sums over every process seen (exited ones at their last value),
    # so the drain's CPU is the difference between the samples around its first claim
    # and its last completion: start-up before, shutdown after are left out.
    res = ProbeResult(
        timeline=[(10.0, 0.5, 0.1), (11.0, 0.9, 0.3), (12.0, 1.4, 0.6), (13.0, 1.5, 0.6)]
    )
    worker, backends = res.cpu_between(10.5, 12.5)
    assert (round(worker, 6), round(backends, 6)) == (0.9, 0.5)
    assert res.cpu_between(9.0, 9.5) == (0.0, 0.0)
    res.waits.update({"": 6, "IO:WALSync": 3, "LWLock:WALWrite": 1})
    res.active_samples = 10
    assert (res.share(""), res.share("IO:"), res.share("Lock:")) == (60.0, 30.0, 0.0)


def test_minimal_limit_is_its_best_configuration_and_divides_leaseq_and_own_statements() -> None:
    # The seed's minimal table has a limit of its own, chosen as the raw one is (best
    # median per clock); the three ratios of issue 35 divide by it and by the raw limit.
    series = raw_series(
        {
            raw_key(2, 100, "db"): [40.0, 40.0, 40.0],
            minimal.key(1, 100, "db"): [30.0, 30.0, 30.0],
            minimal.key(4, 100, "db"): [80.0, 80.0, 80.0],
        }
    )
    series["drain-leaseq-2p-db"] = Series(
        Metric("drain-leaseq-2p-db", "drain-leaseq-2p", "x"), [Sample(1, 1 / 20.0)] * 3
    )
    finish_raw(series)
    minimal.finish(series)
    assert series[f"{minimal.LIMIT}-db"].figures() == [80.0] * 3
    assert "4 processes, batch 100" in series[f"{minimal.LIMIT}-db"].metric.label
    by_label = {r.label: r for r in minimal.RATIOS}
    own = next(
        r for label, r in by_label.items() if label.startswith("own statements / minimal, best")
    )
    overall = next(
        r for label, r in by_label.items() if label.startswith("leaseq async 2p / minimal")
    )
    assert round_ratios(series, own) == [0.5] * 3  # 40 / 80
    assert round_ratios(series, overall) == [0.25] * 3  # 20 / 80
    table = summary.markdown(series)
    assert "**minimal limit (excl.)**: the seed's minimal table and statements" in table
