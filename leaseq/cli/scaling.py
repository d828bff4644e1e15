"""The autoscaling commands: ``leaseq scaling set QUEUE``, ``leaseq scaling clear QUEUE``
and ``leaseq scaling show``, a thin layer over ``Client.set_scaling`` / ``clear_scaling``
/ ``autoscaling`` (docs/autoscaling.md)."""

from __future__ import annotations

import click

from leaseq.cli.render import age, emit_json, table
from leaseq.cli.settings import Settings, actor_option, pass_settings


@click.group()
def scaling() -> None:
    """The autoscaling signal: suggested workers per queue."""


@scaling.command("set")
@click.argument("queue")
@click.option("--concurrency", type=int, required=True, help="Handlers one worker runs.")
@click.option("--min", "min_workers", type=int, default=0, show_default=True)
@click.option("--max", "max_workers", type=int, help="At most this many workers.")
@actor_option("set it")
@pass_settings
def scaling_set(
    settings: Settings,
    queue: str,
    concurrency: int,
    min_workers: int,
    max_workers: int | None,
    actor: str,
) -> None:
    """Tell the signal how many handlers a worker of QUEUE runs, and its bounds."""
    settings.client.set_scaling(
        queue,
        concurrency=concurrency,
        min_workers=min_workers,
        max_workers=max_workers,
        actor=actor,
    )
    bound = "" if max_workers is None else f", at most {max_workers}"
    click.echo(
        f"scaling of {queue} set by {actor}: {concurrency} per worker, "
        f"at least {min_workers}{bound}"
    )


@scaling.command("clear")
@click.argument("queue")
@pass_settings
def scaling_clear(settings: Settings, queue: str) -> None:
    """Forget QUEUE's setting (10 handlers per worker, no bounds)."""
    if settings.client.clear_scaling(queue):
        click.echo(f"scaling of {queue} cleared")
    else:
        click.echo(f"there was no scaling setting for {queue}")


@scaling.command("show")
@click.argument("queue", required=False)
@click.option("--json", "as_json", is_flag=True)
@pass_settings
def scaling_show(settings: Settings, queue: str | None, as_json: bool) -> None:
    """Each queue: claimable, running, oldest wait, per worker, suggested workers."""
    found = settings.reader.autoscaling(queue)
    if as_json:
        emit_json([x.as_dict() for x in found])
        return
    rows = [
        [
            x.queue,
            x.claimable,
            x.running,
            age(x.oldest_wait),
            x.concurrency,
            x.suggested_workers,
            "paused" if x.paused else "",
        ]
        for x in found
    ]
    click.echo(
        table(["queue", "claimable", "running", "oldest wait", "per worker", "workers", ""], rows)
        if rows
        else "no queue has work or a scaling setting"
    )


COMMANDS: tuple[click.Command, ...] = (scaling,)
