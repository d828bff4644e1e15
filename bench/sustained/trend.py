"""Is the run flat? The steady state (every interval after the warm-up one) split in
thirds: the mean of the first third against the mean of the last, for throughput and for
the size of every table and index, with the slope between the two (per minute); and the
size of each relation at a few marks of the run (5, 10, 20, 30 minutes on a 30-minute run).
"""

from __future__ import annotations

from collections.abc import Sequence
from statistics import fmean
from typing import Any

from bench.report import table
from bench.sustained.model import Interval

MB = 1024 * 1024
#: Relations smaller than this all run long are left out of the size tables.
SMALL = 256 * 1024
#: Size marks of a run of 30 minutes or more, in minutes.
MARKS = (5.0, 10.0, 20.0, 30.0)


def thirds(steady: Sequence[Interval]) -> tuple[Sequence[Interval], Sequence[Interval]]:
    """The first and the last third of the steady intervals (one each at least)."""
    n = max(1, len(steady) // 3)
    return steady[:n], steady[-n:]


def relations(intervals: Sequence[Interval]) -> list[str]:
    """The tables and indexes worth showing: any that reached SMALL in the run."""
    biggest: dict[str, int] = {}
    for iv in intervals:
        for name, size in iv.table.sizes:
            biggest[name] = max(biggest.get(name, 0), size)
    return sorted(name for name, size in biggest.items() if size >= SMALL)


def size_of(iv: Interval, name: str) -> int:
    return dict(iv.table.sizes).get(name, 0)


def flatness(intervals: Sequence[Interval]) -> dict[str, Any]:
    """Throughput and sizes, first third against last third of the steady state."""
    steady = intervals[1:]
    if len(steady) < 2:
        return {}
    first, last = thirds(steady)
    minutes = (fmean(iv.t for iv in last) - fmean(iv.t for iv in first)) / 60

    def trend(value: Any) -> dict[str, float | None]:
        a, b = fmean(value(iv) for iv in first), fmean(value(iv) for iv in last)
        return {
            "first_third": a,
            "last_third": b,
            "last_over_first": b / a if a else None,
            "per_minute": (b - a) / minutes if minutes > 0 else None,
        }

    sizes = {name: trend(lambda iv, n=name: size_of(iv, n)) for name in relations(intervals)}
    return {
        "throughput": trend(lambda iv: iv.finished_per_s),
        "pruned_per_s": trend(lambda iv: iv.pruned_per_s),
        "jobs_table_bytes": trend(lambda iv: iv.table.table_bytes),
        "jobs_index_bytes": trend(lambda iv: iv.table.index_bytes),
        "jobs_toast_bytes": trend(lambda iv: iv.table.toast_bytes),
        "dead_tuples": trend(lambda iv: iv.table.dead_tuples),
        "sizes": sizes,
    }


def flatnesstable(f: dict[str, Any]) -> str:
    """One row per figure: first third, last third, ratio, change per minute."""
    if not f:
        return "fewer than 2 steady intervals: no thirds to compare"

    def row(label: str, t: dict[str, Any], scale: float, unit: str) -> list[str]:
        ratio = t["last_over_first"]
        slope = t["per_minute"]
        return [
            label,
            f"{t['first_third'] / scale:,.1f}",
            f"{t['last_third'] / scale:,.1f}",
            "-" if ratio is None else f"{ratio:.3f}",
            "-" if slope is None else f"{slope / scale:+,.2f} {unit}/min",
        ]

    rows = [
        row("finished/s", f["throughput"], 1, "jobs/s"),
        row("pruned rows/s", f["pruned_per_s"], 1, "rows/s"),
        row("dead tuples (jobs)", f["dead_tuples"], 1, "tuples"),
        row("jobs heap MB", f["jobs_table_bytes"], MB, "MB"),
        row("jobs indexes MB", f["jobs_index_bytes"], MB, "MB"),
    ]
    rows += [row(f"{name} MB", t, MB, "MB") for name, t in f["sizes"].items()]
    return table(
        ["first vs last third of the steady state", "first", "last", "last/first", "slope"],
        rows,
        right={1, 2, 3, 4},
    )


def marks(intervals: Sequence[Interval]) -> list[Interval]:
    """The intervals nearest to 5, 10, 20 and 30 minutes on a run of 30 minutes or more;
    otherwise to a sixth, a third, two thirds and the end of the run."""
    end = intervals[-1].t
    if end >= MARKS[-1] * 60 - 1:
        wanted = [m * 60 for m in MARKS]
    else:
        wanted = [end * f for f in (1 / 6, 1 / 3, 2 / 3, 1)]
    picked: list[Interval] = []
    for at in wanted:
        nearest = min(intervals, key=lambda iv: abs(iv.t - at))
        if all(nearest is not p for p in picked):
            picked.append(nearest)
    return picked


def sizes_at(intervals: Sequence[Interval]) -> dict[str, dict[str, int]]:
    """Bytes of each relation at each mark, keyed by the mark's time in whole seconds."""
    return {
        f"{iv.t:.0f}": {name: size_of(iv, name) for name in relations(intervals)}
        for iv in marks(intervals)
    }


def sizestable(intervals: Sequence[Interval]) -> str:
    """Relations down, marks across, in MB."""
    at = marks(intervals)
    rows = [
        [name, *(f"{size_of(iv, name) / MB:,.1f}" for iv in at)] for name in relations(intervals)
    ]
    headers = ["relation, MB at", *(f"{iv.t / 60:.1f} min" for iv in at)]
    return table(headers, rows, right=set(range(1, len(headers))))
