"""The CLI's unique-job options (``leaseq enqueue --unique-key ...``) and how a conflict
and a key's holder are shown. The rules themselves are in ``leaseq.rules.unique``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from leaseq.cli.settings import DURATION
from leaseq.models import UniqueKeyHolder
from leaseq.rules.unique import FINAL_STATES, LIVE_STATES, ON_CONFLICT, EnqueueResult

F = TypeVar("F", bound=Callable[..., Any])


def unique_options(fn: F) -> F:
    """--unique-key, --unique-for, --unique-state, --on-conflict, --debounce, --debounce-max."""
    options = [
        click.option(
            "--unique-key",
            default=None,
            help="At most one live job holds this key (see docs/unique.md).",
        ),
        click.option(
            "--unique-for",
            type=DURATION,
            default=None,
            help="Keep the key held this long after the job finished, e.g. 1h.",
        ),
        click.option(
            "--unique-state",
            "unique_states",
            multiple=True,
            type=click.Choice(LIVE_STATES + FINAL_STATES),
            help="A state that holds the key (repeat; pending and running are required).",
        ),
        click.option(
            "--on-conflict",
            type=click.Choice(ON_CONFLICT),
            default=None,
            help="When the key is held: skip (default), replace, or raise (exit non-zero).",
        ),
        click.option(
            "--debounce",
            type=DURATION,
            default=None,
            help="Run this long after the latest enqueue of the key (implies replace).",
        ),
        click.option(
            "--debounce-max",
            type=DURATION,
            default=None,
            help="...but no later than this long after the first.",
        ),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def clean(unique: dict[str, Any]) -> dict[str, Any]:
    """The options as ``enqueue`` takes them (no --unique-state given: None)."""
    return {**unique, "unique_states": list(unique["unique_states"]) or None}


def unique_outcome(result: EnqueueResult) -> dict[str, Any]:
    """The JSON fields of an enqueue's outcome (none without a conflict)."""
    if result.outcome is None:
        return {}
    return {
        "inserted": result.inserted,
        "outcome": result.outcome,
        "conflict_state": result.conflict_state,
    }


def conflict_line(result: EnqueueResult) -> str:
    """One line about a conflict, for stderr (stdout keeps just the id)."""
    if result.outcome == "skip":
        return f"unique key held by job {int(result)} ({result.conflict_state}): nothing stored"
    if result.outcome == "replace":
        return f"replaced pending job {int(result)}"
    return f"holder is running: queued follow-up job {int(result)}"


def holder_line(job_id: int, holder: UniqueKeyHolder) -> str:
    """The ``jobs show`` line about a job's unique key."""
    if holder.job_id is None:
        who = "held by nobody"
    elif holder.held_until is not None:
        who = f"held by job {holder.job_id} until {holder.held_until.isoformat(timespec='seconds')}"
        who += " (window after it finished)"
    elif holder.job_id == job_id:
        who = "held by this job"
    else:
        who = f"held by job {holder.job_id} (this job is superseded)"
    return f"unique key: {holder.key} — {who}"
