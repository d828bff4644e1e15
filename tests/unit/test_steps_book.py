"""The step book's decisions without a database: a recorded step is answered from its
record at its place, a new one runs at the next place, and misuse or a changed order is
refused with its code."""

from __future__ import annotations

import datetime as dt

import pytest

from leaseq.models import StepRecord
from leaseq.worker.steps import StepBook, StepError

AT = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def _book(*names: str) -> StepBook:
    book = StepBook()
    book.load([StepRecord(n, i, 1, 1, AT, f"r{i}") for i, n in enumerate(names)])
    return book


def test_recorded_steps_are_answered_and_new_ones_run_at_the_next_place() -> None:
    book = _book("a", "b")
    assert book.begin("a") == (0, StepRecord("a", 0, 1, 1, AT, "r0"))
    assert book.begin("b")[1] is not None and book.active is None
    assert book.begin("c") == (2, None)
    assert book.active is not None and (book.active.name, book.active.seq) == ("c", 2)


def test_a_failed_step_frees_its_name_and_place() -> None:
    book = _book()
    book.begin("a")
    assert book.active is not None
    book.failed(book.active)
    assert book.begin("a") == (0, None)


@pytest.mark.parametrize(
    ("recorded", "calls", "code"),
    [
        ((), ("a", "a"), "STEP_NAME_REUSED"),
        (("a", "b"), ("b",), "STEP_OUT_OF_ORDER"),
        (("a",), ("z",), "STEP_OUT_OF_ORDER"),
        ((), ("outer", "inner"), "STEP_NAME_REUSED"),  # outer is still running: nested
    ],
)
def test_misuse_and_changed_order_are_refused(
    recorded: tuple[str, ...], calls: tuple[str, ...], code: str
) -> None:
    book = _book(*recorded)
    with pytest.raises(StepError) as raised:
        for name in calls:
            book.begin(name)
            if book.active is not None and name == "a":
                book.active = None  # "a" finished (its record written)
    assert raised.value.code == code


def test_a_patch_marker_is_new_code_unless_another_step_holds_its_place() -> None:
    fresh = _book("a")
    fresh.begin("a")
    assert fresh.patch("v2") == (1, None), "not reached yet: recorded, the new branch"
    old = _book("a", "old-b")
    old.begin("a")
    assert old.patch("v2") == (-1, False), "an old run recorded another step here"
    assert old.begin("old-b")[1] is not None, "and the old branch goes on at its place"
    rerun = _book("a", "patch:v2", "new-b")
    rerun.begin("a")
    assert rerun.patch("v2")[1] is True
