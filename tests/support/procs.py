"""Real worker processes for crash tests: start, signal, wait, read what they printed; the
state of a process (alive, stopped, its children) as psutil reads it."""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import time
from collections.abc import Callable

import psutil

ROOT = pathlib.Path(__file__).resolve().parents[2]
_STOPPED: str = psutil.STATUS_STOPPED
_ZOMBIE: str = psutil.STATUS_ZOMBIE


class WorkerProcess:
    """``leaseq worker tests.support.apps.basic:app ARGS`` as a child process, output to a file."""

    def __init__(
        self,
        dsn: str,
        schema: str,
        *args: str,
        log_dir: pathlib.Path,
        app: str = "tests.support.apps.basic:app",
        global_args: tuple[str, ...] = (),
        wrapper: tuple[str, ...] = (),
    ) -> None:
        """``wrapper`` prefixes the command (e.g. ``ip netns exec NS`` for another host)."""
        env = dict(os.environ)
        env.update(LEASEQ_DSN=dsn, LEASEQ_SCHEMA=schema, PYTHONPATH=str(ROOT))
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = log_dir / f"worker-{time.monotonic_ns()}.log"
        self._log = self.log_path.open("w")
        self.proc = subprocess.Popen(
            [*wrapper, sys.executable, "-m", "leaseq", "-v", *global_args, "worker", app, *args],
            env=env,
            cwd=ROOT,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def wait(self, timeout: float) -> int:
        """Its exit code; past ``timeout``, a failure that shows what it printed (a worker
        that never finishes is a finding, and its log is the evidence)."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"the worker did not exit within {timeout} s; its output (the end):\n"
                + self.output()[-6000:]
            ) from None

    def output(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text()

    def kill(self) -> None:
        if self.proc.poll() is None:
            if stopped(self.proc.pid):
                os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.kill()
            self.proc.wait(10)
        self._log.close()

    def __enter__(self) -> WorkerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()


def _status(pid: int) -> str | None:
    """The kernel's state of ``pid`` (a ``psutil.STATUS_*`` value), or None once it is gone."""
    try:
        status: str = psutil.Process(pid).status()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None
    return status


def stopped(pid: int) -> bool:
    """True while ``pid`` is stopped by a signal (SIGSTOP/SIGTSTP)."""
    return _status(pid) == _STOPPED


def alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    return _status(pid) not in (None, _ZOMBIE)


def children(pid: int) -> set[int]:
    """Live child processes of ``pid`` (zombies excluded)."""
    try:
        kids = psutil.Process(pid).children()
    except psutil.NoSuchProcess:
        return set()
    return {kid.pid for kid in kids if alive(kid.pid)}


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")
