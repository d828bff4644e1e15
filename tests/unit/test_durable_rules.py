"""A durable wait's decision without a database (leaseq.rules.durable)."""

from __future__ import annotations

import pytest

from leaseq.rules.durable import WaitDecision, decide_wait


@pytest.mark.parametrize(
    ("until", "signal", "sent", "expected"),
    [
        (None, "s", False, WaitDecision.SUSPEND),  # no timeout: wait for ever
        (None, "s", True, WaitDecision.DELIVER),
        (110.0, "s", False, WaitDecision.SUSPEND),  # not yet timed out
        (100.0, "s", False, WaitDecision.TIMEOUT),  # due exactly now: timed out
        (90.0, "s", True, WaitDecision.DELIVER),  # sent (before it was found): delivered
        (110.0, None, False, WaitDecision.SUSPEND),  # a sleep not yet due
        (100.0, None, False, WaitDecision.DUE),
        (90.0, None, False, WaitDecision.DUE),
    ],
)
def test_decide_wait(until: float | None, signal: str | None, sent: bool, expected: str) -> None:
    assert decide_wait(now=100.0, until=until, signal=signal, sent=sent) is expected
