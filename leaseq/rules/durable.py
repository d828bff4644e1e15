"""What a durable wait does at its point in the handler, pure (``ctx.sleep``,
``ctx.wait_for``; docs/durable.md): go on, deliver the signal, time out, or suspend the job
until its wake-up time. The caller reads the database clock and the signal under the job's
row lock and carries the decision out in that same transaction."""

from __future__ import annotations

import enum


class WaitDecision(enum.StrEnum):
    DUE = "due"  # a sleep whose time has come: the handler goes on
    DELIVER = "deliver"  # the awaited signal was sent: record it in the step, return it
    TIMEOUT = "timeout"  # the wait's time ran out first: record it, raise WaitTimeout
    SUSPEND = "suspend"  # give the lease back and wait (until the wake-up time, if any)


def decide_wait(*, now: float, until: float | None, signal: str | None, sent: bool) -> WaitDecision:
    """``now``: the database clock (epoch seconds); ``until``: the wake-up time fixed the
    first time the step ran (None: a wait without timeout); ``signal``: the signal waited
    for (None: a sleep); ``sent``: that signal is stored. A signal sent before the timeout
    but found after it still counts: it was there first."""
    if signal is not None and sent:
        return WaitDecision.DELIVER
    if until is not None and until <= now:
        return WaitDecision.DUE if signal is None else WaitDecision.TIMEOUT
    return WaitDecision.SUSPEND
