"""Pure rules, no database: the state machine table and the retry policy."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from leaseq.errors import ConfigError
from leaseq.retry import RetryPolicy
from leaseq.states import JobStatus, allowed, decide_failure


def test_failure_with_attempts_left_is_retried_after_the_policy_delay() -> None:
    d = decide_failure(attempt=1, max_attempts=3, retryable=True, delay=4.5)
    assert d.to_status is JobStatus.PENDING and d.delay == 4.5 and d.retry


def test_last_attempt_failure_is_dead_not_deleted() -> None:
    d = decide_failure(attempt=3, max_attempts=3, retryable=True, delay=4.5)
    assert d.to_status is JobStatus.DEAD and not d.retry


def test_permanent_failure_is_dead_on_first_attempt() -> None:
    d = decide_failure(attempt=1, max_attempts=8, retryable=False, delay=1.0)
    assert d.to_status is JobStatus.DEAD


@pytest.mark.parametrize(
    ("event", "src", "dst", "ok"),
    [
        ("claim", JobStatus.PENDING, JobStatus.RUNNING, True),
        ("claim", JobStatus.RUNNING, JobStatus.RUNNING, False),
        ("complete", JobStatus.RUNNING, JobStatus.SUCCEEDED, True),
        ("complete", JobStatus.DEAD, JobStatus.SUCCEEDED, False),
        ("replay", JobStatus.DEAD, JobStatus.PENDING, True),
        ("replay", JobStatus.CANCELLED, JobStatus.PENDING, True),
        ("replay", JobStatus.SUCCEEDED, JobStatus.PENDING, False),
        ("release", JobStatus.RUNNING, JobStatus.PENDING, True),
        ("cancel", JobStatus.RUNNING, JobStatus.CANCELLED, False),
        ("teleport", JobStatus.PENDING, JobStatus.SUCCEEDED, False),
    ],
)
def test_transition_table(event: str, src: JobStatus, dst: JobStatus, ok: bool) -> None:
    assert allowed(event, src, dst) is ok


def test_terminal_states() -> None:
    assert {s for s in JobStatus if s.terminal} == {"succeeded", "dead", "cancelled"}


def test_policy_grows_exponentially_until_the_cap() -> None:
    policy = RetryPolicy(base=1.0, factor=2.0, cap=10.0, rng=lambda: 1.0)
    assert [policy.delay(n) for n in range(1, 7)] == [1.0, 2.0, 4.0, 8.0, 10.0, 10.0]


def test_handler_retry_in_wins_but_not_beyond_the_cap() -> None:
    policy = RetryPolicy(base=1.0, cap=30.0, rng=lambda: 0.5)
    assert policy.delay(5, retry_in=3.0) == 3.0
    assert policy.delay(5, retry_in=3600.0) == 30.0
    assert policy.delay(5, retry_in=-2.0) == 0.0


def test_nonsense_policy_is_refused() -> None:
    with pytest.raises(ConfigError):
        RetryPolicy(base=0)
    with pytest.raises(ConfigError):
        RetryPolicy(base=10, cap=1)


@given(
    attempt=st.integers(min_value=1, max_value=100_000),
    base=st.floats(min_value=0.001, max_value=100),
    cap=st.floats(min_value=100, max_value=1e6),
    r=st.floats(min_value=0, max_value=1, exclude_max=True),
)
def test_jitter_stays_within_zero_and_the_ceiling(
    attempt: int, base: float, cap: float, r: float
) -> None:
    policy = RetryPolicy(base=base, cap=cap, rng=lambda: r)
    delay = policy.delay(attempt)
    assert 0 <= delay <= policy.ceiling(attempt) <= cap


@given(
    attempt=st.integers(min_value=1, max_value=50),
    max_attempts=st.integers(min_value=1, max_value=50),
    retryable=st.booleans(),
)
def test_attempt_budget_is_never_exceeded(attempt: int, max_attempts: int, retryable: bool) -> None:
    d = decide_failure(attempt=attempt, max_attempts=max_attempts, retryable=retryable, delay=1)
    if d.retry:
        # A retry means another claim, which makes attempt + 1: still within budget.
        assert retryable and attempt + 1 <= max_attempts
    else:
        assert not retryable or attempt >= max_attempts
