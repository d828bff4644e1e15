"""leaseq.rules.batching: the claim size sized by the measured round trip."""

from __future__ import annotations

import pytest

from leaseq.rules.batching import ClaimCost, amortised_size, claim_size


def costs(pairs: list[tuple[int, float]]) -> ClaimCost:
    cost = ClaimCost()
    for jobs, seconds in pairs:
        cost = cost.observe(jobs, seconds)
    return cost


def linear(fixed: float, per_job: float, sizes: list[int]) -> ClaimCost:
    return costs([(b, fixed + per_job * b) for b in sizes])


def test_the_fit_recovers_the_fixed_and_per_job_parts() -> None:
    fit = linear(0.002, 0.00001, [10, 50, 100, 200, 37, 100]).fit()
    assert fit is not None
    fixed, per_job = fit
    assert fixed == pytest.approx(0.002, rel=1e-6)
    assert per_job == pytest.approx(0.00001, rel=1e-6)


def test_the_claim_size_amortises_the_fixed_part_to_the_overhead_within_bounds() -> None:
    # 0.5 ms fixed, 10 us a job: at 450 jobs the fixed part is a tenth of the claim.
    cost = linear(0.0005, 0.00001, [20, 80, 100, 60])
    assert amortised_size(0.0005, 0.00001) == pytest.approx(450)
    assert claim_size(cost, current=100, floor=1, ceiling=1000) == 450
    assert claim_size(cost, current=100, floor=1, ceiling=300) == 300
    assert claim_size(cost, current=100, floor=500, ceiling=1000) == 500
    # A dearer round trip (a commit waiting on a slow disk) asks for bigger claims.
    slow = linear(0.004, 0.00001, [20, 80, 100, 60])
    assert claim_size(slow, current=100, floor=1, ceiling=1000) == 1000
    # A tighter overhead asks for more, a looser one for fewer.
    assert claim_size(cost, current=100, floor=1, ceiling=5000, overhead=0.05) == 950
    assert claim_size(cost, current=100, floor=1, ceiling=5000, overhead=0.5) == 50


def test_without_spread_in_the_sizes_it_doubles_the_current_size() -> None:
    same = linear(0.001, 0.00001, [100] * 10)
    assert same.fit() is None
    assert claim_size(same, current=100, floor=1, ceiling=1000) == 200
    assert claim_size(same, current=700, floor=1, ceiling=1000) == 1000
    assert claim_size(ClaimCost(), current=10, floor=1, ceiling=1000) == 20


def test_claims_that_returned_nothing_or_took_no_time_are_left_out() -> None:
    cost = linear(0.001, 0.00001, [10, 100])
    assert cost.observe(0, 0.5) == cost
    assert cost.observe(10, 0.0) == cost
    assert cost.observe(10, float("nan")) == cost


def test_a_fit_with_a_part_below_zero_is_not_used() -> None:
    # Bigger claims that came back faster: noise, not a cost model.
    shrinking = costs([(10, 0.005), (100, 0.002), (200, 0.001)])
    assert shrinking.fit() is None
    assert claim_size(shrinking, current=50, floor=1, ceiling=1000) == 100


def test_recent_claims_weigh_most_so_a_slower_server_is_followed() -> None:
    cost = linear(0.0005, 0.00001, [20, 80, 100, 60] * 5)
    for _ in range(30):
        for b in (20, 80, 100, 60):
            cost = cost.observe(b, 0.004 + 0.00001 * b)
    fit = cost.fit()
    assert fit is not None and fit[0] > 0.003  # the fixed part moved to the new server's


def test_the_overhead_must_be_a_share() -> None:
    with pytest.raises(ValueError):
        claim_size(ClaimCost(), current=1, floor=1, ceiling=10, overhead=1.0)
