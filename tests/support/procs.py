"""Real worker processes for crash tests: start, signal, wait, read what they printed."""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import time
from collections.abc import Callable

ROOT = pathlib.Path(__file__).resolve().parents[2]


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
        return self.proc.wait(timeout)

    def output(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text()

    def kill(self) -> None:
        if self.proc.poll() is None:
            if _stopped(self.proc.pid):
                os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.kill()
            self.proc.wait(10)
        self._log.close()

    def __enter__(self) -> WorkerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()


def _stopped(pid: int) -> bool:
    try:
        return pathlib.Path(f"/proc/{pid}/stat").read_text().split()[2] == "T"
    except (OSError, IndexError):
        return False


def alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        return pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def children(pid: int) -> set[int]:
    """Live child processes of ``pid`` (from /proc; zombies excluded)."""
    found = set()
    for stat in pathlib.Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[1]) == pid:
            found.add(int(stat.parent.name))
    return found


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")
