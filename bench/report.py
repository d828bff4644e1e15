"""Output of the benchmark: figure formatting, plain-text tables, the ``python -m bench``
report (header, figure table, ratio table), its JSON results file, and the description of
the run's environment that every JSON file of bench/ records.
"""

from __future__ import annotations

import datetime as dt
import os
import pathlib
import platform
from collections.abc import Sequence
from typing import Any

import psycopg

import leaseq
from bench.harness import (
    REPO_ROOT,
    Ratio,
    Sample,
    Series,
    Settings,
    git_revision,
    leaseq_root,
    round_ratios,
    size_label,
    spread,
)
from leaseq.dsn import describe_dsn


def fmt_figure(value: float, unit: str) -> str:
    if unit.endswith("/s"):
        return f"{value:,.0f}"
    if unit == "%":
        return f"{value:.0f}"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], right: set[int]) -> str:
    """Columns padded to their widest cell; the columns in ``right`` right-aligned."""
    widths = [max(len(r[i]) for r in [headers, *rows]) for i in range(len(headers))]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(headers), rule, *(line(r) for r in rows)])


def display_path(path: pathlib.Path) -> str:
    try:
        return str(path.resolve().relative_to(pathlib.Path.cwd()))
    except ValueError:
        return str(path)


def server_line(what: str, dsn: str, info: dict[str, Any]) -> str:
    """The first header line: the database, its durability settings and the CPU count."""
    return (
        f"leaseq {what}: {describe_dsn(dsn)}, PostgreSQL {info['server_version']} "
        f"(fsync={info['fsync']}, synchronous_commit={info['synchronous_commit']}), "
        f"{os.cpu_count()} CPUs"
    )


def environment(dsn: str, info: dict[str, Any], *, from_repo: bool) -> dict[str, Any]:
    """What a JSON results file records about the run's environment (``from_repo`` adds
    whether leaseq was imported from this checkout)."""
    return {
        "when": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "leaseq_version": leaseq.__version__,
        "leaseq_path": str(leaseq_root()),
        "git": git_revision(),
        **({"leaseq_from_repo": leaseq_root() == REPO_ROOT} if from_repo else {}),
        "python": platform.python_version(),
        "psycopg": psycopg.__version__,
        "cpus": os.cpu_count(),
        "database": describe_dsn(dsn),
        "server": info,
    }


def progress(key: str, sample: Sample, unit: str) -> str:
    """One figure of a per-sample progress line."""
    text = f"{key} {fmt_figure(sample.figure, unit)} {unit}"
    return text + (f" ({sample.seconds:.2f}s)" if sample.value is None else "")


def render(
    series: dict[str, Series],
    settings: Settings,
    info: dict[str, Any],
    ratios: Sequence[Ratio],
    skipped: dict[str, str] | None = None,
    header: Sequence[str] = (),
    notes: Sequence[str] = (),
) -> str:
    """The report: header (plus the scenarios' ``header`` lines), one row per measured
    metric, one per ratio with both sides measured, the skipped scenarios, and ``notes``."""
    rows: list[list[str]] = []
    for s in series.values():
        if not s.samples:
            continue
        st = spread(s.figures())
        unit = s.metric.unit
        rows.append(
            [
                s.metric.scenario,
                s.metric.label,
                f"{s.samples[0].jobs:,}",
                fmt_figure(st["median"], unit),
                f"{fmt_figure(st['min'], unit)}-{fmt_figure(st['max'], unit)}",
                unit,
            ]
        )
    headers = ["scenario", "what", "n", "median", "min-max", "unit"]
    out = [
        server_line("bench", settings.dsn, info),
        *([] if leaseq_root() == REPO_ROOT else [f"leaseq imported from {leaseq_root()}"]),
        f"jobs={settings.jobs:,} batch={settings.batch} concurrency={settings.concurrency} "
        f"single={settings.single:,} repeat={settings.repeat} prune-old={settings.prune_old:,} "
        f"claims={settings.claims:,} backlogs={','.join(map(size_label, settings.backlogs))} "
        f"expired={settings.expired:,} wake-jobs={settings.wake_jobs} "
        f"checkpoint-after-fill={'yes' if settings.checkpoint else 'no (not allowed)'}",
        *header,
        "",
        table(headers, rows, right={2, 3, 4}),
    ]
    ratio_rows: list[list[str]] = []
    for ratio in ratios:
        values = round_ratios(series, ratio)
        if values:
            st = spread(values)
            ratio_rows.append(
                [ratio.label, f"{st['median']:.2f}", f"{st['min']:.2f}-{st['max']:.2f}"]
            )
    if ratio_rows:
        out += ["", table(["ratio (per round)", "median", "min-max"], ratio_rows, right={1, 2})]
    if skipped:
        out += ["", *(f"skipped {name}: {why}" for name, why in skipped.items())]
    for note in notes:
        out += ["", note]
    return "\n".join(out)


def results_json(
    series: dict[str, Series],
    settings: Settings,
    info: dict[str, Any],
    ratios: Sequence[Ratio],
    skipped: dict[str, str] | None,
    peers: dict[str, dict[str, Any]],
    claim_explain: pathlib.Path | None,
) -> dict[str, Any]:
    metrics = []
    for s in series.values():
        if s.samples:
            metrics.append(
                {
                    "key": s.metric.key,
                    "scenario": s.metric.scenario,
                    "label": s.metric.label,
                    "unit": s.metric.unit,
                    "jobs": s.samples[0].jobs,
                    "figure": spread(s.figures()),
                    "samples": [
                        {"jobs": x.jobs, "seconds": x.seconds, "figure": x.figure}
                        for x in s.samples
                    ],
                }
            )
    ratio_list = []
    for ratio in ratios:
        values = round_ratios(series, ratio)
        if values:
            ratio_list.append(
                {
                    "label": ratio.label,
                    "numerator": ratio.numerator,
                    "denominator": ratio.denominator,
                    "inverse": ratio.inverse,
                    "per_round": values,
                    **spread(values),
                }
            )
    return {
        **environment(settings.dsn, info, from_repo=True),
        "settings": {
            "jobs": settings.jobs,
            "batch": settings.batch,
            "concurrency": settings.concurrency,
            "single": settings.single,
            "repeat": settings.repeat,
            "prune_old": settings.prune_old,
            "claims": settings.claims,
            "backlogs": list(settings.backlogs),
            "expired": settings.expired,
            "wake_jobs": settings.wake_jobs,
            "peer_jobs": settings.peer_jobs,
            "checkpoint_after_fill": settings.checkpoint,
        },
        "peers": peers,
        "metrics": metrics,
        "ratios": ratio_list,
        "skipped": dict(skipped or {}),
        "claim_explain": None if claim_explain is None else str(claim_explain),
    }
