"""The workflow commands: ``leaseq batches show ID``, ``leaseq waiting`` (jobs waiting on
dependencies and what they wait for), and the dependency and batch lines of ``jobs show``."""

from __future__ import annotations

from typing import Any

import click

from leaseq.cli.render import age, emit_json, table
from leaseq.cli.settings import Failed, Settings, pass_settings
from leaseq.client import Client


def workflow_fields(client: Client, job_id: int) -> dict[str, Any]:
    """A job's dependencies, dependents (first 50) and batch, for ``jobs show``."""
    return {
        "depends_on": [d.as_dict() for d in client.dependencies(job_id)],
        "dependents": [d.as_dict() for d in client.dependents(job_id, limit=50)],
        "batch_id": client.job_batch(job_id),
    }


def workflow_lines(fields: dict[str, Any]) -> list[str]:
    lines = []
    if fields["depends_on"]:
        shown = ", ".join(
            f"{d['job_id']} ({d['status'] or 'gone'}, on_dead {d['on_dead']})"
            for d in fields["depends_on"]
        )
        lines.append(f"{'depends_on':20} {shown}")
    if fields["dependents"]:
        shown = ", ".join(
            f"{d['job_id']} ({'waiting' if d['waiting'] else d['status']})"
            for d in fields["dependents"]
        )
        lines.append(f"{'dependents':20} {shown}")
    if fields["batch_id"] is not None:
        lines.append(f"{'batch':20} {fields['batch_id']}")
    return lines


@click.group()
def batches() -> None:
    """Inspect batches (groups of jobs with callbacks)."""


@batches.command("show")
@click.argument("batch_id", type=int)
@click.option("--json", "as_json", is_flag=True)
@pass_settings
def batches_show(settings: Settings, batch_id: int, as_json: bool) -> None:
    """A batch's state, its jobs' counts by status, and its callbacks."""
    info = settings.reader.get_batch(batch_id)
    if info is None:
        raise Failed(f"no batch with id {batch_id}")
    if as_json:
        emit_json(info.as_dict())
        return
    click.echo(f"batch {info.id}: {info.state}")
    counts = ", ".join(f"{n} {s}" for s, n in sorted(info.counts.items())) or "no jobs"
    click.echo(f"jobs: {counts}")
    for kind, task in (
        ("success", info.on_success),
        ("failure", info.on_failure),
        ("finish", info.on_finish),
    ):
        if task is not None:
            job = info.callbacks.get(kind)
            fired = f"enqueued as job {job}" if job is not None else "not fired"
            click.echo(f"on_{kind}: {task} ({fired})")
    if info.state == "open":
        click.echo("open: callbacks fire only after it is sealed")


@click.command()
@click.option("--limit", type=int, default=50, show_default=True)
@click.option("--json", "as_json", is_flag=True)
@pass_settings
def waiting(settings: Settings, limit: int, as_json: bool) -> None:
    """Jobs waiting on dependencies, oldest first, with the jobs they still wait for."""
    found = settings.reader.waiting_jobs(limit=limit)
    if as_json:
        emit_json(
            [
                {"id": i, "queue": q, "task": t, "waiting_seconds": s, "waiting_for": w}
                for i, q, t, s, w in found
            ]
        )
        return
    if not found:
        click.echo("no job is waiting on dependencies")
        return
    rows = [[i, q, t, age(s), ", ".join(map(str, w[:10])) or "-"] for i, q, t, s, w in found]
    click.echo(table(["job", "queue", "task", "waiting", "waiting for"], rows))


COMMANDS = (batches, waiting)
