"""tests/support/procs.py reads a process's state right whatever its command name: a name
with a space (or a parenthesis and a fake state letter) once shifted the fields of
/proc/PID/stat, so a stopped worker looked running and was never sent SIGCONT."""

from __future__ import annotations

import os
import pathlib
import shutil
import signal
import subprocess
from collections.abc import Iterator

import pytest

from tests.support.procs import alive, children, stopped, wait_for

# `comm` keeps 15 bytes; both names fit. The second would fool a parser that splits on
# whitespace (field 3 reads "Z") or on the first ")".
NAMES = ["my sleep", "x) Z 1 (sleep"]


@pytest.fixture(params=NAMES)
def oddly_named(request: pytest.FixtureRequest, tmp_path: pathlib.Path) -> Iterator[int]:
    sleep = shutil.which("sleep")
    assert sleep is not None
    program = tmp_path / request.param
    shutil.copy(sleep, program)
    proc = subprocess.Popen([str(program), "60"])
    try:
        comm = pathlib.Path(f"/proc/{proc.pid}/comm")
        wait_for(lambda: comm.read_text().strip() == request.param, 10, "the renamed exec")
        yield proc.pid
    finally:
        os.kill(proc.pid, signal.SIGCONT)
        proc.kill()
        proc.wait(10)


def test_stopped_and_alive_read_right_with_odd_names(oddly_named: int) -> None:
    assert alive(oddly_named)
    assert not stopped(oddly_named)
    assert oddly_named in children(os.getpid())
    os.kill(oddly_named, signal.SIGSTOP)
    wait_for(lambda: stopped(oddly_named), 10, "SIGSTOP to take effect")
    assert alive(oddly_named)
    os.kill(oddly_named, signal.SIGCONT)
    wait_for(lambda: not stopped(oddly_named), 10, "SIGCONT to take effect")


def test_zombie_is_not_alive_and_not_a_child(oddly_named: int) -> None:
    os.kill(oddly_named, signal.SIGKILL)
    # Not reaped yet: the process is a zombie until the fixture's wait().
    wait_for(lambda: not alive(oddly_named), 10, "the killed process to turn zombie")
    assert oddly_named not in children(os.getpid())
    assert not stopped(oddly_named)


def test_gone_process_reads_as_dead() -> None:
    proc = subprocess.Popen(["true"])
    proc.wait(10)
    assert not alive(proc.pid)
    assert not stopped(proc.pid)
    assert proc.pid not in children(os.getpid())
