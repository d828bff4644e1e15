"""The client's pure parts: statement parameters (leaseq.params) and row decoding
(leaseq.rows), shared by the async and sync clients and checked here without a database."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from leaseq.codes import ErrorCode
from leaseq.errors import ConfigError
from leaseq.jobspec import SCHEDULE_HORIZON, job_fields, job_params, schedule
from leaseq.models import Failure, Lease
from leaseq.params import expire_params, fail_params
from leaseq.retry import RetryPolicy
from leaseq.rows import ATTEMPT_MAX, TOKEN_MAX, leases_from_rows

CLOCK = 1_800_000_000.0


def _claim_row(job_id: int, **changes: Any) -> tuple[Any, ...]:
    row: dict[str, Any] = {
        "id": job_id,
        "token": 1,
        "owner": "w",
        "task": "t",
        "queue": "q",
        "payload": f'{{"i": {job_id}}}',
        "attempt": 1,
        "max_attempts": 3,
        "priority": 0,
        "payload_version": None,
        "unknown_failures": 0,
        "idempotency_key": None,
        "ordering_key": None,
        "unique_key": None,
        "limited": False,
        "has_dependents": False,
        "clock": CLOCK,
        "created_age": 2.0,
        "available_age": 1.0,
        "slot_rows": False,
        "cost_problem": None,
    }
    row.update(changes)
    return tuple(row.values())


@pytest.mark.parametrize(
    ("changes", "code"),
    [
        ({"token": TOKEN_MAX}, ErrorCode.ROW_OUT_OF_RANGE),
        ({"attempt": ATTEMPT_MAX}, ErrorCode.ROW_OUT_OF_RANGE),
        ({"created_age": None}, ErrorCode.ROW_OUT_OF_RANGE),
        ({"available_age": None}, ErrorCode.ROW_OUT_OF_RANGE),
        ({"created_age": -1e13}, ErrorCode.ROW_OUT_OF_RANGE),
        ({"payload": "[" * 5000 + "]" * 5000}, ErrorCode.INVALID_PAYLOAD),
        ({"payload": "{not json"}, ErrorCode.INVALID_PAYLOAD),
        (
            {"cost_problem": "cost 3 is above the concurrency 2 of limit key:k"},
            ErrorCode.COST_OVER_LIMIT,
        ),
    ],
)
def test_a_row_that_cannot_be_a_lease_is_set_aside_not_raised(
    changes: dict[str, Any], code: ErrorCode
) -> None:
    rows = [_claim_row(1), _claim_row(2, **changes), _claim_row(3)]
    leases, unclaimable = leases_from_rows(rows, 30.0)
    assert [lease.job_id for lease in leases] == [1, 3]
    assert [lease.payload for lease in leases] == [{"i": 1}, {"i": 3}]
    (bad,) = unclaimable
    assert (bad.job_id, bad.owner, bad.code) == (2, "w", code)
    assert bad.token == changes.get("token", 1) and bad.reason


def test_a_good_row_is_the_lease_its_constructor_would_build() -> None:
    ((lease,), []) = leases_from_rows([_claim_row(7)], 30.0)
    claimed = dt.datetime.fromtimestamp(CLOCK, dt.UTC)
    assert lease == Lease(
        7,
        1,
        "w",
        "t",
        "q",
        {"i": 7},
        1,
        3,
        claimed + dt.timedelta(seconds=30),
        created_at=claimed - dt.timedelta(seconds=2),
        lease_seconds=30.0,
        claimed_at=claimed,
        available_at=claimed - dt.timedelta(seconds=1),
    )
    # The two limit flags come through as the claim returned them.
    ((flagged,), []) = leases_from_rows([_claim_row(8, limited=True, slot_rows=True)], 30.0)
    assert flagged.limited and flagged.slot_rows


@pytest.mark.parametrize(
    ("run_at", "delay"),
    [
        (None, SCHEDULE_HORIZON + 1),
        (None, 1e300),
        (None, dt.timedelta(days=999_999_999)),
        (dt.datetime(9999, 12, 31, tzinfo=dt.UTC), None),
        (dt.datetime(1, 1, 2, tzinfo=dt.UTC), None),
    ],
)
def test_a_schedule_beyond_the_horizon_is_refused(run_at: Any, delay: Any) -> None:
    with pytest.raises(ConfigError) as info:
        schedule(run_at, delay)
    assert "\n" not in str(info.value)
    with pytest.raises(ConfigError):
        job_params(job_fields({"task": "t", "run_at": run_at, "delay": delay}), 1024)


def test_the_sweep_and_a_reported_failure_decide_alike() -> None:
    """An expired lease is decided as a reported transient failure (one decision)."""
    policy = RetryPolicy()
    for attempt, max_attempts in [(1, 3), (3, 3)]:
        lease = Lease(1, 1, "w", "t", "q", None, attempt, max_attempts, dt.datetime.now(dt.UTC))
        reported = fail_params([Failure(lease, "E")], policy, None)
        swept = expire_params(
            [(1, 1, "t", attempt, max_attempts, 0, None, None)], policy, None, "s"
        )
        assert swept["to_statuses"] == reported["to_statuses"]
        assert swept["reasons"][0].split(" ")[0] == reported["reasons"][0].split(" ")[0]
