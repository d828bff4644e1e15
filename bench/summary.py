"""The drain table of ``python -m bench``, as markdown (README and docs/performance.md
take it as printed): the seed's minimal table and statements (the limit of the problem) and
leaseq's own statements on leaseq's table (the limit of leaseq's SQL), every configuration
with the best one named, then pgqueuer and leaseq (async and sync handlers) at 1 and 2
processes, each on both clocks, with the ratios to the minimal limit, to leaseq's own
statements and to pgqueuer at the same process count (per-round ratios: median and
min-max)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from bench.harness import Ratio, Series, round_ratios, spread
from bench.scenarios import minimal
from bench.scenarios.drain import RAW_BATCHES, RAW_LIMIT, RAW_PROCESSES, best_raw, raw_key

CLOCKS = ("db", "wall")
HEADERS = (
    "system",
    "configuration",
    "jobs/s, start-up excluded",
    "jobs/s, process wall",
    "vs minimal limit (excl. / wall)",
    "vs own statements (excl. / wall)",
    "vs pgqueuer, same processes (excl. / wall)",
)


def figure(series: dict[str, Series], key: str) -> str:
    s = series.get(key)
    if s is None or not s.samples:
        return "—"
    st = spread(s.figures())
    return f"{st['median']:,.0f} ({st['min']:,.0f}-{st['max']:,.0f})"


def ratio(series: dict[str, Series], num: str, den: str) -> str | None:
    values = round_ratios(series, Ratio("", num, den))
    if not values:
        return None
    st = spread(values)
    return f"{st['median']:.2f} ({st['min']:.2f}-{st['max']:.2f})"


def ratios(series: dict[str, Series], prefix: str, den_prefix: str) -> str:
    parts = [ratio(series, f"{prefix}-{c}", f"{den_prefix}-{c}") for c in CLOCKS]
    return " / ".join(p or "—" for p in parts) if any(parts) else "—"


def has(series: dict[str, Series], prefix: str) -> bool:
    return any(series.get(f"{prefix}-{c}") and series[f"{prefix}-{c}"].samples for c in CLOCKS)


def rows(series: dict[str, Series], compact: bool = False) -> list[list[str]]:
    """The table's rows; ``compact`` leaves out the raw configurations that did not win."""
    out: list[list[str]] = []
    limits = (
        (minimal.key, minimal.best, "minimal limit", "the seed's minimal table and statements"),
        (raw_key, best_raw, "own-statements limit", "leaseq's own statements, no worker"),
    )
    for key_of, best_of, title, what in limits:
        best = {c: best_of(series, c) for c in CLOCKS}
        for batch in RAW_BATCHES:
            for p in RAW_PROCESSES:
                prefix = key_of(p, batch, "x")[:-2]
                if not has(series, prefix):
                    continue
                won = [
                    label
                    for c, label in (("db", "excl."), ("wall", "wall"))
                    if best[c] == f"{prefix}-{c}"
                ]
                if compact and not won:
                    continue
                config = f"{p} process{'es' if p > 1 else ''}, one connection each, batch {batch}"
                system = f"**{title} ({', '.join(won)})**: {what}" if won else what
                own = (
                    "—"
                    if key_of is raw_key
                    else ratios(series, prefix, raw_key(p, batch, "x")[:-2])
                )
                out.append(
                    [
                        system,
                        config,
                        figure(series, f"{prefix}-db"),
                        figure(series, f"{prefix}-wall"),
                        ratios(series, prefix, minimal.LIMIT),
                        own,
                        "—",
                    ]
                )
    for p, suffix in ((1, ""), (2, "-2p")):
        procs = f"{p} process{'es' if p > 1 else ''}"
        pgq = f"drain-pgqueuer{suffix}"
        entries = [
            (pgq, "pgqueuer (asyncpg), no-op handler", f"{procs}, batch 100"),
            (f"drain-leaseq{suffix}", "leaseq, async no-op handler", f"{procs} (`--burst`)"),
            (
                f"drain-leaseq-sync{suffix}",
                "leaseq, **sync** no-op handler",
                f"{procs} (`--burst`)",
            ),
        ]
        for prefix, system, config in entries:
            if not has(series, prefix):
                continue
            vs_pgq = "—" if prefix == pgq else ratios(series, prefix, pgq)
            out.append(
                [
                    system,
                    config,
                    figure(series, f"{prefix}-db"),
                    figure(series, f"{prefix}-wall"),
                    ratios(series, prefix, minimal.LIMIT),
                    ratios(series, prefix, RAW_LIMIT),
                    vs_pgq,
                ]
            )
    return out


def markdown(series: dict[str, Series], intro: Sequence[str] = (), compact: bool = False) -> str:
    """The table (empty string when no drain of the table ran)."""
    body = rows(series, compact)
    if not body:
        return ""
    lines = [*intro, "| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
    lines += ["| " + " | ".join(r) + " |" for r in body]
    return "\n".join(lines)


def best_configs(series: dict[str, Series], of_minimal: bool = False) -> dict[str, str | None]:
    """Which raw (or minimal) configuration won, per clock (for the JSON file)."""
    out: dict[str, str | None] = {}
    for c in CLOCKS:
        key = (minimal.best if of_minimal else best_raw)(series, c)
        out[c] = key
        if key is not None:
            out[f"{c}_jobs_s"] = f"{statistics.median(series[key].figures()):.0f}"
    return out
