"""The soft stop's hand-over with a handler thread (leaseq.worker.stops.StopGate), on
real threads: raised only inside the handler, never before it starts nor after it ended."""

from __future__ import annotations

import threading
import time

from leaseq.worker.stops import HandlerStopped, StopGate


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
