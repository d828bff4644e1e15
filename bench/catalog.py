"""The scenario list of ``python -m bench`` and its ratios, in canonical order: a raw
scenario right before its leaseq twin, the peer drains right after ``drain-leaseq``, so
both sides of a ratio run next to each other in every round. Also what the report needs
from particular scenarios (the peers' header lines, the EXPLAIN note)."""

from __future__ import annotations

import pathlib
from collections.abc import Sequence
from typing import Any

from bench.harness import DEFAULT_BACKLOGS, Ratio, Scenario, Series, Settings, ran
from bench.scenarios import (
    claim_backlog,
    claim_prune,
    drain,
    enqueue,
    peer_drains,
    schedules,
    sweep,
    wake,
)


def build_scenarios(backlogs: Sequence[int] = DEFAULT_BACKLOGS) -> tuple[Scenario, ...]:
    return (
        drain.RAW,
        drain.LEASEQ,
        *peer_drains.SCENARIOS,
        drain.TWO_PROCESSES,
        *enqueue.SCENARIOS,
        claim_prune.SCENARIO,
        claim_backlog.scenario(backlogs),
        sweep.SCENARIO,
        wake.SCENARIO,
        schedules.SCENARIO,
    )


def build_ratios(backlogs: Sequence[int] = DEFAULT_BACKLOGS) -> tuple[Ratio, ...]:
    return (
        *drain.RATIOS,
        *peer_drains.RATIOS,
        *enqueue.RATIOS,
        *claim_prune.RATIOS,
        *claim_backlog.ratios(backlogs),
        *wake.RATIOS,
        *schedules.RATIOS,
    )


SCENARIOS: tuple[Scenario, ...] = build_scenarios()
RATIOS: tuple[Ratio, ...] = build_ratios()


def header_lines(series: dict[str, Series], settings: Settings) -> list[str]:
    """Extra header lines of the report: the peers that ran, their versions and settings."""
    return peer_drains.peer_header(series, settings)


def notes(series: dict[str, Series], settings: Settings) -> list[str]:
    """Lines after the tables: where claim-vs-backlog wrote its EXPLAIN, if it ran."""
    return [claim_backlog.explain_note(settings)] if ran(series, claim_backlog.NAME) else []


def peers(settings: Settings) -> dict[str, dict[str, Any]]:
    return peer_drains.peer_summary(settings)


def explain_file(series: dict[str, Series], settings: Settings) -> pathlib.Path | None:
    return claim_backlog.explain_path(settings) if ran(series, claim_backlog.NAME) else None
