"""``leaseq worker --processes N``: keep N worker processes alive.

A deliberately small supervisor. It starts N copies of the same worker command, restarts
one that dies (with a growing delay if it keeps dying), forwards SIGTERM/SIGINT to all of
them, and exits once they have all exited. Every child is an ordinary worker: leases,
fencing and the sweeper make a crash of one child safe for the others. A child that
hard-stopped a sync handler (``leaseq.worker.stops``, exit code 4) is one that died: it
is replaced the same way.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from types import FrameType

from leaseq.retry import backoff
from leaseq.worker.stops import EXIT_HARD_STOP

log = logging.getLogger("leaseq.supervisor")

#: A child that ran at least this long before dying is restarted at once.
HEALTHY_RUN = 30.0
RESTART_DELAY_CAP = 30.0


@dataclass
class _Slot:
    index: int
    proc: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    failures: int = 0
    restart_at: float = 0.0
    done: bool = False
    restarts: int = 0


class Supervisor:
    def __init__(self, command: Sequence[str], processes: int, *, restart: bool = True) -> None:
        """``restart=False`` (burst/drain mode): a child that exits 0 has finished its work."""
        self.command = list(command)
        self.slots = [_Slot(i) for i in range(processes)]
        self.restart_on_success = restart
        self._stopping = False
        self._signals = 0

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._signals += 1
        self._stopping = True
        for slot in self.slots:
            if slot.proc is not None and slot.proc.poll() is None:
                # Second signal goes through too: children treat it as "exit now".
                slot.proc.send_signal(signum)

    def _spawn(self, slot: _Slot) -> None:
        slot.proc = subprocess.Popen(self.command)
        slot.started = time.monotonic()
        log.info("worker process %d started (pid %d)", slot.index, slot.proc.pid)

    def run(self) -> int:
        previous = {
            sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGTERM, signal.SIGINT)
        }
        try:
            for slot in self.slots:
                self._spawn(slot)
            return self._watch()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _watch(self) -> int:
        # Exit codes of the children's *final* exits; a crash that was restarted is not one.
        final: list[int] = []
        while True:
            now = time.monotonic()
            alive = 0
            for slot in self.slots:
                if slot.done:
                    continue
                proc = slot.proc
                if proc is not None:
                    code = proc.poll()
                    if code is None:
                        alive += 1
                        continue
                    slot.proc = None
                    if self._stopping or (code == 0 and not self.restart_on_success):
                        slot.done = True
                        final.append(_final_code(code, stopping=self._stopping))
                        continue
                    ran = now - slot.started
                    slot.failures = 0 if ran >= HEALTHY_RUN else slot.failures + 1
                    delay = (
                        backoff(slot.failures + 1, base=0.5, cap=RESTART_DELAY_CAP, jitter=0.0)
                        if slot.failures
                        else 0.0
                    )
                    slot.restart_at = now + delay
                    log.warning(
                        "worker process %d (pid %d) exited with %s after %.1fs; "
                        "restarting in %.1fs",
                        slot.index,
                        proc.pid,
                        _exit_reason(code),
                        ran,
                        delay,
                    )
                if self._stopping:
                    slot.done = True
                    continue
                if now >= slot.restart_at:
                    slot.restarts += 1
                    self._spawn(slot)
                    alive += 1
            if all(slot.done for slot in self.slots):
                return max(final, default=0)
            time.sleep(0.1 if alive else 0.05)


def _exit_reason(code: int) -> str:
    if code < 0:
        return f"signal {-code}"
    if code == EXIT_HARD_STOP:
        return f"code {code} (hard stop: a sync handler did not end after its soft stop)"
    return f"code {code}"


def _final_code(code: int, *, stopping: bool) -> int:
    # A child still starting up has no signal handler yet, so the forwarded SIGTERM kills
    # it outright; it held no lease, so that is a clean stop too.
    if stopping and code in (-signal.SIGTERM, -signal.SIGINT):
        return 0
    return code if code >= 0 else 1
