"""How the command line shows things: aligned tables, ages, JSON, the per-queue status.

Shared by the operator commands and ``leaseq demo``; it knows nothing about click's commands.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import click

from leaseq.models import QueueStats
from leaseq.rules.pauses import Pause


def emit_json(value: Any) -> None:
    click.echo(json.dumps(value, indent=2, default=str))


def age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.1f}s"
    if seconds < 7200:
        return f"{seconds / 60:.1f}m"
    return f"{seconds / 3600:.1f}h"


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(line.rstrip() for line in lines)


def render_status(stats: Sequence[QueueStats], pauses: Sequence[Pause] = ()) -> str:
    """The per-queue table; paused queues are marked, and paused tasks and keys counted."""
    paused = {p.value for p in pauses if p.scope == "queue"}
    footer = _pause_footer(pauses, {s.queue for s in stats})
    if not stats:
        return "\n".join(["no pending, running or dead jobs", *footer])
    headers = [
        "queue",
        "ready",
        "scheduled",
        "running",
        "dead",
        "oldest ready",
        "oldest dead",
        "done/min",
    ]
    rows = [
        [
            f"{s.queue} (paused)" if s.queue in paused else s.queue,
            s.ready,
            s.scheduled,
            s.running,
            s.dead,
            age(s.oldest_ready_age) if s.ready else "-",
            age(s.oldest_dead_age) if s.dead else "-",
            "-" if s.finished_recently is None else s.finished_recently,
        ]
        for s in stats
    ]
    return "\n".join([table(headers, rows), *footer])


def _pause_footer(pauses: Sequence[Pause], shown: set[str]) -> list[str]:
    lines = []
    idle = sorted(p.value for p in pauses if p.scope == "queue" and p.value not in shown)
    if idle:
        lines.append("paused queues without jobs: " + ", ".join(idle))
    tasks = sum(p.scope == "task" for p in pauses)
    keys = sum(p.scope == "ordering_key" for p in pauses)
    if tasks or keys:
        lines.append(f"paused: {tasks} task(s), {keys} ordering key(s) (see `leaseq pauses`)")
    return lines
