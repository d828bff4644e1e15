"""`leaseq worker -pN` as real processes: one supervisor and exactly N workers, however
N was spelled and even when the environment also says N (the children inherit it)."""

from __future__ import annotations

import os
import pathlib
import signal
import time

import pytest

import leaseq
from tests.support.procs import WorkerProcess, alive, children, wait_for


def _descendants(pid: int) -> set[int]:
    found: set[int] = set()
    frontier = {pid}
    while frontier:
        below = set().union(*(children(p) for p in frontier))
        found |= below
        frontier = below
    return found


@pytest.mark.parametrize(
    ("args", "env"),
    [
        (["-p2"], {}),
        (["-c", "3", "-p", "2"], {}),
        (["--processes=2"], {}),
        ([], {"LEASEQ_WORKER_PROCESSES": "2"}),
    ],
    ids=["-p2", "-c3-p2", "--processes=2", "env"],
)
def test_supervisor_runs_exactly_n_workers(
    dsn: str,
    schema: str,
    client: leaseq.Client,
    tmp_path: pathlib.Path,
    monkeypatch: pytest.MonkeyPatch,
    args: list[str],
    env: dict[str, str],
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with WorkerProcess(dsn, schema, *args, log_dir=tmp_path) as supervisor:
        try:
            # Every worker prints its start line once it serves (the supervisor runs none); a
            # child that became a supervisor itself would have started its own children, whose
            # lines would come on top.
            wait_for(
                lambda: supervisor.output().count("worker serving postgresql://") >= 2,
                30,
                "the supervisor and two workers to start",
            )
            time.sleep(0.5)
            seen = _descendants(supervisor.pid)
            assert len(children(supervisor.pid)) == 2, supervisor.output()
            assert len(seen) == 2, f"{len(seen)} processes below the supervisor"
            assert supervisor.output().count("worker serving postgresql://") == 2
            supervisor.signal(signal.SIGTERM)
            assert supervisor.wait(30) == 0, supervisor.output()
        finally:
            _kill_tree(supervisor.pid)


def _kill_tree(pid: int) -> None:
    """Freeze the whole tree first (a frozen process spawns nothing), then kill it."""
    frozen: set[int] = set()
    while fresh := (_descendants(pid) | {pid}) - frozen:
        for p in fresh:
            if alive(p):
                os.kill(p, signal.SIGSTOP)
        frozen |= fresh
    for p in frozen:
        if alive(p):
            os.kill(p, signal.SIGKILL)
