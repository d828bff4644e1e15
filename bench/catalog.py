"""The scenario list of ``python -m bench`` and its ratios, in canonical order: the raw
drain limit first, then pgqueuer and leaseq (async, sync) at 1 process, then the same at 2
processes, so both sides of a ratio run next to each other in every round; a raw enqueue
scenario right before its leaseq twin. Also what the report needs
from particular scenarios (the peers' header lines, the EXPLAIN note)."""

from __future__ import annotations

import dataclasses
import pathlib
from collections.abc import Sequence
from typing import Any

from bench import summary
from bench.harness import DEFAULT_BACKLOGS, Ratio, Scenario, Series, Settings, ran
from bench.scenarios import (
    backlog,
    claim_backlog,
    claim_prune,
    drain,
    enqueue,
    graphile,
    limited,
    minimal,
    peer_drains,
    regression,
    scale,
    schedules,
    sweep,
    wake,
    workloads,
)


def build_scenarios(backlogs: Sequence[int] = DEFAULT_BACKLOGS) -> tuple[Scenario, ...]:
    return (
        drain.RAW,
        minimal.SCENARIO,
        peer_drains.PGQUEUER_1P,
        *drain.SCENARIOS_1P,
        peer_drains.PGQUEUER_2P,
        *drain.SCENARIOS_2P,
        dataclasses.replace(drain.ADAPTIVE_2P, default=False),  # --only drain-leaseq-adaptive-2p
        *graphile.SCENARIOS,  # opt-in: Node.js and `npm ci` in bench/peers/graphile
        *peer_drains.OTHERS,
        regression.SCENARIO,
        limited.SCENARIO,
        *enqueue.SCENARIOS,
        # Opt-in (--only NAME, or --only all): together they take longer than the default.
        *(
            dataclasses.replace(s, default=False)
            for s in (
                claim_prune.SCENARIO,
                claim_backlog.scenario(backlogs),
                sweep.SCENARIO,
                wake.SCENARIO,
                schedules.SCENARIO,
                *scale.SCENARIOS,
                # The realistic workloads (issue 35): --only 'workload-*'.
                *workloads.SCENARIOS,
                backlog.scenario(max(backlogs)),
            )
        ),
    )


def build_ratios(backlogs: Sequence[int] = DEFAULT_BACKLOGS) -> tuple[Ratio, ...]:
    return (
        *drain.RATIOS,
        *minimal.RATIOS,
        *peer_drains.RATIOS,
        *graphile.RATIOS,
        *regression.RATIOS,
        *limited.RATIOS,
        *scale.RATIOS,
        *enqueue.RATIOS,
        *claim_prune.RATIOS,
        *claim_backlog.ratios(backlogs),
        *wake.RATIOS,
        *schedules.RATIOS,
        *workloads.RATIOS,
        *backlog.RATIOS,
    )


SCENARIOS: tuple[Scenario, ...] = build_scenarios()
RATIOS: tuple[Ratio, ...] = build_ratios()


def header_lines(series: dict[str, Series], settings: Settings) -> list[str]:
    """Extra header lines of the report: the peers that ran, their versions and settings."""
    return peer_drains.peer_header(series, settings)


def notes(series: dict[str, Series], settings: Settings) -> list[str]:
    """Lines after the tables: the regression of the plain drain against the stored
    reference, the scale check's top wait events, where claim-vs-backlog wrote its EXPLAIN."""
    out = [
        "\n".join(lines)
        for lines in (
            regression.reference_lines(series, regression.load_reference()),
            scale.notes(),
        )
        if lines
    ]
    if ran(series, claim_backlog.NAME):
        out.append(claim_backlog.explain_note(settings))
    return out


def summary_markdown(
    series: dict[str, Series], settings: Settings, info: dict[str, Any], compact: bool = False
) -> str:
    """The issue-20 table (bench/summary.py), with a line saying what was run; ``compact``
    (README's) keeps only the winning raw configurations."""
    intro = [
        f"{settings.jobs:,} no-op jobs per drain, batch {settings.batch}, leaseq concurrency "
        f"{settings.concurrency} per process; PostgreSQL {info['server_version']} "
        f"(fsync={info['fsync']}, synchronous_commit={info['synchronous_commit']}); "
        f"{settings.repeat} interleaved rounds, medians (min-max); ratios per round.",
        "",
    ]
    return summary.markdown(series, intro, compact)


def extra_results(series: dict[str, Series]) -> dict[str, Any]:
    """What the JSON file records beyond the figures: the winning raw configurations, the
    plain drains as the regression reference sees them, the scale check's waits."""
    return {
        "raw_limit": summary.best_configs(series),
        "minimal_limit": summary.best_configs(series, of_minimal=True),
        "plain_drain": regression.current(series),
        "scale_waits": dict(scale.DETAILS),
    }


def save_reference(series: dict[str, Series], results: dict[str, Any]) -> pathlib.Path:
    return regression.save_reference(series, results)


def peers(settings: Settings) -> dict[str, dict[str, Any]]:
    return peer_drains.peer_summary(settings)


def explain_file(series: dict[str, Series], settings: Settings) -> pathlib.Path | None:
    return claim_backlog.explain_path(settings) if ran(series, claim_backlog.NAME) else None
