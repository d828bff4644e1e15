"""bench's scenario catalog after the split into one module per scenario: the boundary
is between the scenario modules (each declares its metrics and ratios) and the catalog
that puts them together. Break it (a duplicated key, a ratio naming a metric no scenario
reports, a raw scenario no longer next to its twin) and these fail; no database needed."""

from __future__ import annotations

import pytest

from bench.catalog import build_ratios, build_scenarios
from bench.harness import WORKER_LINE, Metric, Ratio, Sample, Series, round_ratios, select_scenarios

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
        ("drain-raw", "drain-leaseq"),
        ("enqueue-single-raw", "enqueue-single"),
        ("enqueue-bulk-raw", "enqueue-bulk"),
    ):
        assert names.index(twin) == names.index(raw) + 1
    # the peers drain right after drain-leaseq, in the same round
    assert names[names.index("drain-leaseq") + 1].startswith("drain-pgqueuer")


def test_only_keeps_the_canonical_order_whatever_the_order_asked() -> None:
    chosen = select_scenarios(["enqueue-*", "drain-raw"], build_scenarios())
    assert [s.name for s in chosen][:3] == ["drain-raw", "enqueue-single-raw", "enqueue-single"]
    with pytest.raises(SystemExit):
        select_scenarios(["no-such-scenario"], build_scenarios())


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
