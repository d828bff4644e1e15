"""Stopping a sync handler for real: the soft stop raised inside its thread, and the hard
stop when the thread will not end.

A coroutine can be cancelled; a thread cannot. When the worker gives up on a sync attempt
(``max_runtime``, ``NO_PROGRESS``, a cancel, a lost lease, shutdown) it raises
:class:`HandlerStopped` inside the handler's thread with ``PyThreadState_SetAsyncExc`` (the
way Dramatiq's time limit does). Python delivers it at the thread's next bytecode: a handler
running Python code stops there, one blocked in a C call (``time.sleep``, a socket read)
stops when the call returns, and one that catches it and carries on does not stop at all.
Until the thread has really ended its lease is renewed and nothing is reported under it, so
the job is not offered to anyone else unless the lease expires. A thread still running
``stop_grace`` seconds after its soft stop (or after the end of a database outage, if one
came later: :func:`postponed_hard_stop`) gets the *hard stop*: the process exits with
:data:`EXIT_HARD_STOP` and its supervisor starts a fresh one, the way Celery's hard time
limit works; its other attempts end as on a crash (their leases expire).

``StopGate`` is the hand-over between the loop and one attempt's thread: the exception is
only ever raised while the thread is inside the handler, never into leaseq's own code
around it, and a stop that comes before the handler starts keeps it from starting.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import sys
import threading

from leaseq.worker.aborts import JobAborted

log = logging.getLogger("leaseq.worker")

#: ``leaseq worker``'s exit code after a hard stop (a supervisor restarts it).
EXIT_HARD_STOP = 4

_set_async_exc = ctypes.pythonapi.PyThreadState_SetAsyncExc
_set_async_exc.restype = ctypes.c_int


class HandlerStopped(JobAborted):
    """Raised inside a sync handler's thread when the worker stops it (the soft stop).

    Python creates it without arguments; the reason is the attempt's ``ctx.aborted``.
    Let it propagate (``finally`` blocks run as usual): a handler that swallows it is
    hard-stopped ``stop_grace`` seconds later with its whole worker process."""

    def __init__(self, reason: str = "STOPPED", message: str = "") -> None:
        super().__init__(reason, message or "the worker stopped this handler (soft stop)")


def _raise_in(ident: int, exc: type[BaseException] | None) -> None:
    """Make ``exc`` pending in thread ``ident`` (None: withdraw a pending one)."""
    # None is passed as NULL (what withdraws a pending exception), not as Py_None.
    found = _set_async_exc(ctypes.c_ulong(ident), None if exc is None else ctypes.py_object(exc))
    if found > 1:  # cannot happen for one ident; the C API says to undo it if it does
        _set_async_exc(ctypes.c_ulong(ident), None)


class StopGate:
    """Whether one sync attempt's thread is inside its handler, and its one soft stop."""

    __slots__ = ("_ident", "_inside", "_lock", "raised", "requested")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ident = 0
        self._inside = False
        #: A stop was asked for (loop); it was raised inside the running handler.
        self.requested = False
        self.raised = False

    def enter(self) -> bool:
        """Called by the thread right before the handler: False if a stop came first."""
        with self._lock:
            if self.requested:
                return False
            self._ident = threading.get_ident()
            self._inside = True
            return True

    def leave(self) -> None:
        """Called by the thread once the handler returned or raised. A stop raised as the
        handler was returning is still pending: it is withdrawn here, and one that lands in
        this very call is absorbed (it came too late to matter: the handler is done)."""
        while True:
            try:
                with self._lock:
                    if self._inside:
                        self._inside = False
                        if self.raised:
                            _raise_in(self._ident, None)
                return
            except HandlerStopped:
                continue

    def request(self) -> bool:
        """Called by the loop: stop this attempt; True if raised inside its handler now
        (False: asked before it started, so it will not start, or asked already)."""
        with self._lock:
            if self.requested:
                return False
            self.requested = True
            if not self._inside:
                return False
            _raise_in(self._ident, HandlerStopped)
            self.raised = True
            return True


def postponed_hard_stop(
    now: float,
    *,
    grace: float,
    database_down: bool,
    outage_ended_at: float | None,
    recheck: float,
) -> float | None:
    """A hard stop has come due at ``now``: None to carry it out, else when to look again.

    Not while the database is unreachable (look again in ``recheck`` seconds), nor within
    ``grace`` of the end of the last outage: a handler blocked in a database call waits for
    the same outage as the worker, and a new process could not connect either."""
    if database_down:
        return now + recheck
    if outage_ended_at is not None and now < outage_ended_at + grace:
        return outage_ended_at + grace
    return None


def exit_now(code: int = EXIT_HARD_STOP) -> None:
    """The hard stop itself: flush what was logged, then end the process at once (no
    cleanup that could wait on the stuck thread, no lease released: they expire)."""
    for handler in logging.getLogger().handlers + log.handlers:
        with contextlib.suppress(Exception):  # exiting anyway
            handler.flush()
    sys.stderr.flush()
    os._exit(code)
