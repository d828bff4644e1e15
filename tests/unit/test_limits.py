"""The pure rules of limits (leaseq.rules.limits, App task options): names, families, rates,
the limit key a task computes at enqueue. Bad input is refused before anything is sent."""

from __future__ import annotations

from typing import Any

import pytest

import leaseq
from leaseq import ConfigError, PayloadError, RateLimit
from leaseq.rules.limits import (
    admitted_prefix,
    check_limit_key,
    check_limit_name,
    cost_fits,
    limit_params,
    task_limit_name,
)


@pytest.mark.parametrize("name", ["queue:q", "task:app.send", "key:c-42", "key:customer:*"])
def test_limit_names_of_the_three_scopes_are_accepted(name: str) -> None:
    assert check_limit_name(name) == name


@pytest.mark.parametrize("name", ["q", "pool:x", "queue:", "", None, 3, "key:" + "x" * 300])
def test_other_limit_names_are_refused(name: Any) -> None:
    with pytest.raises(ConfigError):
        check_limit_name(name)


def test_limit_needs_a_concurrency_or_a_rate_and_checks_both() -> None:
    with pytest.raises(ConfigError):
        limit_params("queue:q", None, None, None, None)
    with pytest.raises(ConfigError):
        limit_params("queue:q", 0, None, None, None)
    params = limit_params("queue:q", None, RateLimit(5, per=2, burst=3), "ann", None)
    assert (params["rate"], params["per"], params["burst"]) == (5.0, 2.0, 3)
    assert limit_params("queue:q", 4, None, None, None)["burst"] == 1


def test_rate_limit_burst_defaults_to_one_and_bad_rates_are_refused() -> None:
    assert RateLimit(10).burst_size == 1
    for bad in [(0,), (True,), (float("nan"),), (1, -1), (1, 1, 0), (1, 1, 1.5)]:
        with pytest.raises(ConfigError):
            RateLimit(*bad)  # type: ignore[arg-type]


def test_limit_key_bounds() -> None:
    assert check_limit_key(None) is None
    assert check_limit_key("customer:1") == "customer:1"
    for bad in ["", "x" * 201, "a\x00b", 5]:
        with pytest.raises(ConfigError):
            check_limit_key(bad)


def test_task_options_declare_their_limit_and_compute_the_key_at_enqueue() -> None:
    app = leaseq.App("postgresql://unused")

    @app.task(name="exp", concurrency=3)
    def exp(ctx: Any, payload: Any) -> None: ...

    @app.task(name="sync", concurrency=1, concurrency_key="customer", rate_limit=RateLimit(9))
    def sync(ctx: Any, payload: Any) -> None: ...

    @app.task(name="calc", concurrency=2, concurrency_key=lambda p: p["a"] + p["b"])
    def calc(ctx: Any, payload: Any) -> None: ...

    assert exp.limit == ("task:exp", 3, None)
    assert sync.limit == ("key:sync:*", 1, RateLimit(9))
    assert task_limit_name("sync", keyed=True) == "key:sync:*"
    assert sync._options({"customer": 42}, {})["limit_key"] == "sync:42"
    assert sync._options({"customer": 42}, {"limit_key": "mine"})["limit_key"] == "mine"
    assert calc._options({"a": 1, "b": 2}, {})["limit_key"] == "calc:3"
    with pytest.raises(PayloadError):
        sync._options({"other": 1}, {})


def test_bad_task_limit_options_are_refused_at_registration() -> None:
    app = leaseq.App("postgresql://unused")
    with pytest.raises(ConfigError):
        app.task(name="a", concurrency=0)(lambda ctx, p: None)
    with pytest.raises(ConfigError):
        app.task(name="b", concurrency_key="k")(lambda ctx, p: None)
    with pytest.raises(ConfigError):
        app.task(name="c", concurrency=1, concurrency_key=5)(lambda ctx, p: None)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("costs", "free", "admitted"),
    [
        ([], 5, 0),
        ([1, 1, 1], 5, 3),
        ([3, 3, 1], 5, 1),  # the second does not fit: the third (which would) waits behind it
        ([2, 3], 5, 2),
        ([6], 5, 0),
        ([1, 4, 1], 5, 2),
        ([1, 1], 0, 0),
    ],
)
def test_a_claim_admits_the_longest_prefix_whose_costs_fit(
    costs: list[int], free: int, admitted: int
) -> None:
    assert admitted_prefix(costs, free) == admitted


def test_a_cost_fits_a_limit_only_up_to_its_concurrency() -> None:
    assert cost_fits(3, 3) and cost_fits(1, 1)
    assert not cost_fits(4, 3)
