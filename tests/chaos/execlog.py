"""The execution logs the chaos handlers write (tests/chaos/app.py), read back: one
:class:`Execution` per handler run (job, token, process), from its S, T and E lines."""

from __future__ import annotations

import pathlib
from dataclasses import dataclass


@dataclass
class Execution:
    """One handler run, from the execution logs."""

    job: int
    token: int
    pid: int
    worker: str
    start: float
    tx: float | None = None
    end: float | None = None
    outcome: str | None = None
    detail: str = ""


def read_executions(directory: pathlib.Path) -> list[Execution]:
    found: dict[tuple[int, int, int], Execution] = {}
    for path in sorted(directory.glob("exec-*.log")):
        for line in path.read_text().splitlines():
            parts = line.split("\t")
            if len(parts) < 6:
                continue  # a line cut by kill -9 mid-write (one write(2): not expected)
            job, token, pid = int(parts[1]), int(parts[2]), int(parts[3])
            ex = found.get((job, token, pid))
            if ex is None:  # the S line comes first: one writer, one O_APPEND descriptor
                ex = found[job, token, pid] = Execution(job, token, pid, parts[4], float(parts[5]))
            if parts[0] == "T":
                ex.tx = float(parts[5])
            elif parts[0] == "E" and len(parts) >= 9:
                ex.tx = None if parts[6] == "-" else float(parts[6])
                ex.end = float(parts[7])
                ex.outcome = parts[8]
                ex.detail = parts[9] if len(parts) > 9 else ""
    return list(found.values())
