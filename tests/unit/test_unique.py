"""The pure rules of unique jobs (leaseq.rules.unique), without a database: which options are
accepted, what a conflict resolves to, and that an EnqueueResult still is the job id."""

from __future__ import annotations

import datetime as dt
import pickle

import pytest

from leaseq.errors import ConfigError
from leaseq.jobspec import job_fields, job_params
from leaseq.rules.unique import (
    DEFAULT_WINDOW_STATES,
    LIVE_STATES,
    EnqueueResult,
    ReplayResult,
    UniqueOptions,
    holder_state,
    resolve_conflict,
    unique_options,
)


def test_without_a_key_there_are_no_options_and_no_other_option_is_accepted() -> None:
    assert unique_options(None) is None
    with pytest.raises(ConfigError, match="unique_for, on_conflict needs a unique_key"):
        unique_options(None, unique_for=5, on_conflict="skip")


def test_defaults_hold_the_key_among_live_jobs_and_with_a_window_after_success() -> None:
    assert unique_options("k") == UniqueOptions("k", None, LIVE_STATES, "skip")
    windowed = unique_options("k", unique_for=dt.timedelta(hours=1))
    assert windowed is not None
    assert (windowed.window, windowed.states) == (3600.0, DEFAULT_WINDOW_STATES)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"unique_states": ["pending"]}, "must contain pending and running"),
        ({"unique_states": "pending"}, "list of states"),
        ({"unique_states": ["pending", "running", "lost"]}, "unknown state"),
        ({"unique_states": ["pending", "running", "cancelled"]}, "no unique_for"),
        ({"unique_for": 0}, "more than 0"),
        ({"unique_for": float("inf")}, "more than 0"),
        ({"unique_for": True}, "seconds or a timedelta"),
        ({"on_conflict": "merge"}, "on_conflict must be"),
        ({"debounce": 5, "on_conflict": "raise"}, "contradicts"),
        ({"debounce_max": 5}, "debounce_max needs debounce"),
        ({"debounce": 10, "debounce_max": 5}, "at least debounce"),
    ],
)
def test_bad_options_are_one_line_config_errors(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        unique_options("k", **kwargs)  # type: ignore[arg-type]
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("key", ["", "x" * 201, "a\x00b", "\ud800", 7])
def test_bad_keys_are_refused(key: object) -> None:
    with pytest.raises(ConfigError, match="unique_key must be"):
        unique_options(key)


def test_states_are_kept_in_canonical_order_without_duplicates() -> None:
    options = unique_options(
        "k", unique_for=1, unique_states=["dead", "running", "pending", "dead", "succeeded"]
    )
    assert options is not None
    assert options.states == ("pending", "running", "succeeded", "dead")


def test_debounce_implies_replace_and_sets_the_delay() -> None:
    options = unique_options("k", debounce=2)
    assert options is not None and options.on_conflict == "replace"
    params = job_params(job_fields({"task": "t", "unique_key": "k", "debounce": 2}), 1000)
    assert params["delay"] == 2.0 and not params["reschedule"]
    with pytest.raises(ConfigError, match="no run_at or delay"):
        job_params(job_fields({"task": "t", "unique_key": "k", "debounce": 2, "delay": 1}), 1000)


@pytest.mark.parametrize(
    ("on_conflict", "state", "window", "outcome"),
    [
        ("skip", "pending", False, "skip"),
        ("skip", "running", False, "skip"),
        ("raise", "running", False, "raise"),
        ("raise", "succeeded", True, "raise"),
        ("replace", "pending", False, "replace"),
        ("replace", "running", False, "follow_up"),
        # a finished job's window is never replaced: its job is done
        ("replace", "succeeded", True, "skip"),
        ("replace", "finished", True, "skip"),
    ],
)
def test_a_conflict_resolves_so_that_a_running_job_is_never_modified(
    on_conflict: str, state: str, window: bool, outcome: str
) -> None:
    assert resolve_conflict(on_conflict, state, window) == outcome


def test_the_state_of_a_pruned_holder_is_finished() -> None:
    assert holder_state(None, dt.datetime.now(dt.UTC)) == "finished"
    assert holder_state("running", None) == "running"


def test_an_enqueue_result_is_the_job_id() -> None:
    plain = EnqueueResult(42)
    assert plain == 42 and str(plain) == "42" and f"{plain}" == "42"
    assert repr(plain) == "EnqueueResult(42)"  # what happened shows in a repr (issue 30)
    assert plain.inserted and not plain.existing and plain.outcome is None
    held = EnqueueResult(7, inserted=False, conflict_state="running", outcome="skip")
    assert held.existing and {7: "x"}[held] == "x"
    assert pickle.loads(pickle.dumps(held)) == 7
    assert ReplayResult(3, [(1, 2)]).refused == ((1, 2),) and ReplayResult(3) == 3
