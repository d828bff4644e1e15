"""Pure rules, no database: the state machine table, classification and the retry policy."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from leaseq.errors import ConfigError, Permanent, Retry
from leaseq.retry import Classifier, ErrorClass, RetryPolicy
from leaseq.states import JobStatus, decide_failure
from leaseq.validate import parse_duration


def test_transient_failure_with_attempts_left_is_retried_after_the_policy_delay() -> None:
    d = decide_failure(attempt=1, max_attempts=3, error_class="transient", delay=4.5)
    assert d.to_status is JobStatus.PENDING and d.delay == 4.5 and d.retry


def test_last_attempt_failure_is_dead_not_deleted() -> None:
    d = decide_failure(attempt=3, max_attempts=3, error_class="transient", delay=4.5)
    assert d.to_status is JobStatus.DEAD and d.reason == "all 3 attempts used"


def test_permanent_failure_is_dead_on_first_attempt() -> None:
    d = decide_failure(attempt=1, max_attempts=8, error_class="permanent", delay=1.0)
    assert d.to_status is JobStatus.DEAD and d.reason == "permanent failure"


def test_unknown_failures_have_their_own_smaller_budget() -> None:
    kwargs = {"attempt": 2, "max_attempts": 8, "error_class": "unknown", "delay": 1.0}
    assert decide_failure(**kwargs, unknown_failures=0, unknown_attempts=3).retry
    assert decide_failure(**kwargs, unknown_failures=1, unknown_attempts=3).retry
    dead = decide_failure(**kwargs, unknown_failures=2, unknown_attempts=3)
    assert not dead.retry and "unknown cause" in dead.reason
    # transient failures do not spend the unknown budget
    assert decide_failure(
        attempt=5, max_attempts=8, error_class="transient", delay=1, unknown_failures=2
    ).retry


def test_time_budget_stops_retries_that_would_start_too_late() -> None:
    common = {"attempt": 2, "max_attempts": 8, "error_class": "transient", "max_elapsed": 60.0}
    assert decide_failure(**common, delay=10, elapsed=49).retry
    late = decide_failure(**common, delay=10, elapsed=51)
    assert not late.retry and "time budget" in late.reason


def test_terminal_states() -> None:
    assert {s for s in JobStatus if s.terminal} == {"succeeded", "dead", "cancelled"}


def test_policy_grows_exponentially_until_the_cap() -> None:
    policy = RetryPolicy(base=1.0, factor=2.0, cap=10.0, rng=lambda: 1.0)
    assert [policy.delay(n) for n in range(1, 7)] == [1.0, 2.0, 4.0, 8.0, 10.0, 10.0]


def test_full_jitter_uses_the_whole_window() -> None:
    policy = RetryPolicy(base=1.0, cap=100.0, rng=lambda: 0.25)
    assert policy.delay(4) == 2.0  # 0.25 * 8


def test_handler_retry_in_wins_but_not_beyond_the_cap() -> None:
    policy = RetryPolicy(base=1.0, cap=30.0, rng=lambda: 0.5)
    assert policy.delay(5, retry_in=3.0) == 3.0
    assert policy.delay(5, retry_in=3600.0) == 30.0
    assert policy.delay(5, retry_in=-2.0) == 0.0


@pytest.mark.parametrize(
    "kwargs",
    [{"base": 0}, {"base": 10, "cap": 1}, {"max_elapsed": 0}, {"unknown_attempts": 0}],
)
def test_nonsense_policy_is_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ConfigError):
        RetryPolicy(**kwargs)  # type: ignore[arg-type]


class Flaky(Exception):
    pass


class VeryFlaky(Flaky):
    pass


def test_classification_order_explicit_then_task_then_app_then_unknown() -> None:
    classifier = Classifier.build(
        {VeryFlaky: "permanent"}, [(Flaky, "transient"), (ValueError, "permanent")]
    )
    assert classifier.classify(Permanent("BAD_INPUT")) == (ErrorClass.PERMANENT, "BAD_INPUT")
    assert classifier.classify(Retry("SLOW", retry_in=3)) == (ErrorClass.TRANSIENT, "SLOW")
    assert classifier.classify(VeryFlaky()) == (ErrorClass.PERMANENT, "VeryFlaky")
    assert classifier.classify(Flaky()) == (ErrorClass.TRANSIENT, "Flaky")
    assert classifier.classify(ValueError()) == (ErrorClass.PERMANENT, "ValueError")
    assert classifier.classify(KeyError()) == (ErrorClass.UNKNOWN, "KeyError")
    import psycopg

    from leaseq.errors import DatabaseUnavailable

    assert classifier.classify(psycopg.OperationalError("server closed the connection"))[0] == (
        ErrorClass.TRANSIENT
    )
    assert classifier.classify(DatabaseUnavailable("down"))[0] == ErrorClass.TRANSIENT


@pytest.mark.parametrize("rules", [{"not a type": "permanent"}, {ValueError: "sometimes"}])
def test_bad_error_rules_are_refused(rules: dict[object, str]) -> None:
    with pytest.raises(ConfigError):
        Classifier.build(rules, None)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("text", "seconds"), [("90", 90), ("90s", 90), ("15m", 900), ("2h", 7200), ("7d", 604800)]
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "soon", "-5m", "5 years"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(ConfigError):
        parse_duration(text)


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
    retry_in=st.one_of(st.none(), st.floats(allow_nan=False, allow_infinity=False)),
    cap=st.floats(min_value=1, max_value=1e5),
)
def test_delay_never_exceeds_the_cap(attempt: int, retry_in: float | None, cap: float) -> None:
    assert 0 <= RetryPolicy(base=1, cap=cap).delay(attempt, retry_in) <= cap


@given(
    attempt=st.integers(min_value=1, max_value=50),
    max_attempts=st.integers(min_value=1, max_value=50),
    error_class=st.sampled_from(["permanent", "transient", "unknown"]),
    unknown_failures=st.integers(min_value=0, max_value=10),
    unknown_attempts=st.integers(min_value=1, max_value=10),
    elapsed=st.floats(min_value=0, max_value=1e5),
    delay=st.floats(min_value=0, max_value=1e4),
    max_elapsed=st.one_of(st.none(), st.floats(min_value=1, max_value=1e5)),
)
def test_every_budget_is_respected(
    attempt: int,
    max_attempts: int,
    error_class: str,
    unknown_failures: int,
    unknown_attempts: int,
    elapsed: float,
    delay: float,
    max_elapsed: float | None,
) -> None:
    d = decide_failure(
        attempt=attempt,
        max_attempts=max_attempts,
        error_class=error_class,
        delay=delay,
        unknown_failures=unknown_failures,
        unknown_attempts=unknown_attempts,
        elapsed=elapsed,
        max_elapsed=max_elapsed,
    )
    if d.retry:
        assert error_class != "permanent"
        assert attempt + 1 <= max_attempts, "the retry's claim stays within max_attempts"
        assert error_class != "unknown" or unknown_failures + 1 < unknown_attempts
        assert max_elapsed is None or elapsed + d.delay <= max_elapsed
        assert d.delay == delay
    else:
        assert d.to_status is JobStatus.DEAD and d.delay == 0


@given(st.text(max_size=20_000))
def test_bounded_detail_always_fits_its_column(text: str) -> None:
    from leaseq.validate import ERROR_DETAIL_MAX, bound_detail

    bounded = bound_detail(text)
    assert bounded is not None and len(bounded) <= ERROR_DETAIL_MAX and "\x00" not in bounded
