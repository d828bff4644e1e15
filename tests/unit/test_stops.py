"""The soft stop's hand-over with a handler thread (leaseq.worker.stops.StopGate), on
real threads: raised only inside the handler, never before it starts nor after it ended."""

from __future__ import annotations

import threading
import time

from leaseq.worker.stops import HandlerStopped, StopGate, postponed_hard_stop


def _run(gate: StopGate, inside: threading.Event, seen: list[str]) -> None:
    """A handler between enter() and leave(), then leaseq's own code after it."""
    try:
        try:
            if not gate.enter():
                seen.append("not started")
                return
            inside.set()
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:  # Python code: the stop lands at once
                time.sleep(0.001)
            seen.append("ran to the end")
        finally:
            gate.leave()
        time.sleep(0.05)  # leaseq's own code after the handler: nothing may land here
        seen.append("after")
    except HandlerStopped:
        seen.append("stopped")


def test_a_stop_is_raised_inside_a_running_handler() -> None:
    gate, inside, seen = StopGate(), threading.Event(), []
    thread = threading.Thread(target=_run, args=(gate, inside, seen))
    thread.start()
    assert inside.wait(10)
    assert gate.request() is True
    thread.join(10)
    assert not thread.is_alive() and seen == ["stopped"]
    assert gate.request() is False, "one stop per attempt"


def test_a_stop_before_the_handler_starts_keeps_it_from_starting() -> None:
    gate, inside, seen = StopGate(), threading.Event(), []
    assert gate.request() is False  # nothing to raise into yet
    thread = threading.Thread(target=_run, args=(gate, inside, seen))
    thread.start()
    thread.join(10)
    assert seen == ["not started"] and not inside.is_set()


def test_a_stop_after_the_handler_returned_is_not_raised() -> None:
    gate, seen = StopGate(), []
    left = threading.Event()

    def run() -> None:
        try:
            assert gate.enter()
            gate.leave()
            left.set()
            time.sleep(0.1)
            seen.append("after")
        except HandlerStopped:
            seen.append("stopped")

    thread = threading.Thread(target=run)
    thread.start()
    assert left.wait(10)
    assert gate.request() is False
    thread.join(10)
    assert seen == ["after"]


def test_the_hard_stop_waits_out_a_database_outage_and_a_grace_after_it() -> None:
    def due(now: float, down: bool = False, ended: float | None = None) -> float | None:
        return postponed_hard_stop(
            now, grace=30.0, database_down=down, outage_ended_at=ended, recheck=2.0
        )

    assert due(100.0) is None  # no outage: now
    assert due(100.0, ended=10.0) is None  # an outage long before the stop
    assert due(100.0, down=True, ended=10.0) == 102.0  # the database is out: look again
    assert due(100.0, ended=90.0) == 120.0  # a grace from the outage's end
    assert due(120.0, ended=90.0) is None
