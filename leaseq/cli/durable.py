"""Durable execution at the command line: `leaseq jobs signal` and what `leaseq jobs show`
prints of a job's steps, waits and signals (docs/durable.md)."""

from __future__ import annotations

import json
from typing import Any

import click

from leaseq.cli.render import table
from leaseq.cli.settings import Failed, Settings, actor_option, pass_settings
from leaseq.codec import shown
from leaseq.errors import InvalidTransition, JobNotFound


@click.command("signal")
@click.argument("args", nargs=-1, metavar="[JOB_ID] SIGNAL")
@click.option("--payload", default=None, help="The signal's payload, as JSON.")
@click.option("--unique-key", default=None, help="Name the job by the unique key it holds.")
@actor_option("sends the signal")
@pass_settings
def jobs_signal(
    settings: Settings,
    args: tuple[str, ...],
    payload: str | None,
    unique_key: str | None,
    actor: str,
) -> None:
    """Send SIGNAL to a job (by JOB_ID, or by --unique-key): one delivery of the name (each
    send is one, taken in order by the job's waits for it, each once); it wakes the job if
    it waits for it (ctx.wait_for), else waits for its wait."""
    if len(args) != (1 if unique_key is not None else 2):
        raise Failed("give JOB_ID SIGNAL, or --unique-key KEY SIGNAL")
    job_id: int | None = None
    if unique_key is None:
        try:
            job_id = int(args[0])
        except ValueError:
            raise Failed(f"JOB_ID must be a number, got {args[0]!r}") from None
    signal = args[-1]
    try:
        value: Any = None if payload is None else json.loads(payload)
    except json.JSONDecodeError as exc:
        raise Failed(f"--payload is not JSON: {exc}") from None
    try:
        stored = settings.client.signal(job_id, signal, value, unique_key=unique_key, actor=actor)
    except JobNotFound as exc:
        raise Failed(str(exc)) from None
    target = f"job {job_id}" if job_id is not None else f"the job holding {unique_key!r}"
    if not stored:
        raise Failed(f"{target}: signal {signal!r} not stored (the job has finished)")
    click.echo(f"{target}: signal {signal!r} sent by {actor}")


@click.command("restart")
@click.argument("job_id", type=int)
@click.option("--from-step", "step", required=True, help="The step to re-run from.")
@click.option("--reason", required=True, help="Why (kept in the audit trail).")
@actor_option("restarts the job")
@pass_settings
def jobs_restart(settings: Settings, job_id: int, step: str, reason: str, actor: str) -> None:
    """Re-run a dead or cancelled job from one of its steps: that step's record and the
    later ones are dropped, the earlier ones kept, and the job replayed (audited)."""
    try:
        cut = settings.client.restart_from_step(job_id, step, reason=reason, actor=actor)
    except (JobNotFound, InvalidTransition) as exc:
        raise Failed(str(exc)) from None
    click.echo(f"job {job_id}: restarted from step {step!r} by {actor}; dropped {', '.join(cut)}")


def durable_fields(reader: Any, job_id: int) -> dict[str, Any]:
    """A job's step records and signals, for `jobs show --json`."""
    return {
        "steps": [s.as_dict() for s in reader.job_steps(job_id)],
        "signals": [
            {"name": n, "payload": shown(p), "sent_at": at.isoformat(), "actor": who}
            for n, p, at, who in reader.job_signals(job_id)
        ],
    }


def _short(value: Any) -> str:
    text = json.dumps(shown(value), default=str)
    return text if len(text) <= 60 else text[:57] + "..."


def durable_lines(fields: dict[str, Any]) -> list[str]:
    """The steps and signals sections of `jobs show` (nothing for a job without them)."""
    lines: list[str] = []
    if fields["steps"]:
        rows = [
            [
                s["seq"] + 1,
                s["name"],
                s["attempt"],
                s["lease_token"],
                str(s["recorded_at"])[:19],
                _short(s["result"]),
            ]
            for s in fields["steps"]
        ]
        lines += [
            "",
            "steps:",
            table(["#", "step", "attempt", "token", "recorded", "result"], rows),
        ]
    if fields["signals"]:
        rows = [
            [
                g["name"],
                g["sent_at"][:19],
                g["actor"] or "-",
                _short(g["payload"]),
            ]
            for g in fields["signals"]
        ]
        lines += ["", "signals:", table(["signal", "sent", "actor", "payload"], rows)]
    return lines


def suspended_lines(reader: Any) -> list[str]:
    """`leaseq status`'s suspended jobs by queue and reason (nothing when none is)."""
    found = reader.suspended_stats()
    if not found:
        return []
    rows = [[s.queue, s.reason or "-", s.count, f"{s.overdue:.0f}s"] for s in found]
    return [
        "",
        "suspended (sleeping or waiting for a signal, holding nothing):",
        table(["queue", "reason", "jobs", "wake-up overdue"], rows),
    ]
