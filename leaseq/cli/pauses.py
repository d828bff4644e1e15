"""The pause commands: ``leaseq pause``, ``leaseq resume`` and ``leaseq pauses`` (the list).
A thin layer over ``Client.pause`` / ``resume`` / ``pauses``: the scope is a QUEUE argument
or ``--task`` / ``--ordering-key``, exactly one of them."""

from __future__ import annotations

import click

from leaseq.cli.render import age, emit_json, table
from leaseq.cli.settings import Settings, actor_option, pass_settings
from leaseq.errors import ConfigError


def _scope_words(queue: str | None, task: str | None, ordering_key: str | None) -> str:
    if task is not None:
        return f"task {task!r}"
    if ordering_key is not None:
        return f"ordering key {ordering_key!r}"
    return f"queue {queue!r}"


def _scope_options(verb: str) -> list[click.Parameter]:
    return [
        click.Argument(["queue"], required=False),
        click.Option(["--task"], help=f"{verb} one task (in every queue) instead of a queue."),
        click.Option(["--ordering-key"], help=f"{verb} one ordering key instead of a queue."),
    ]


def _check_one_scope(queue: str | None, task: str | None, ordering_key: str | None) -> None:
    if sum(x is not None for x in (queue, task, ordering_key)) != 1:
        raise ConfigError("name exactly one scope: QUEUE, --task T or --ordering-key K")


@click.command(params=_scope_options("Pause"))
@click.option("--reason", help="Why (required); kept with the pause and in the audit trail.")
@click.option(
    "--cancel-running",
    is_flag=True,
    help="Also ask running jobs of the scope to stop (seen at their next heartbeat).",
)
@actor_option("paused")
@pass_settings
def pause(
    settings: Settings,
    queue: str | None,
    task: str | None,
    ordering_key: str | None,
    reason: str | None,
    cancel_running: bool,
    actor: str,
) -> None:
    """Stop claims of QUEUE (or --task / --ordering-key) until `leaseq resume`.

    Holds from its commit and through worker restarts and deploys. Running jobs finish
    unless --cancel-running; schedules still enqueue jobs, which wait. A queue with no jobs
    yet can be paused.
    """
    _check_one_scope(queue, task, ordering_key)
    if reason is None or not reason.strip():
        raise ConfigError("pause needs --reason")
    created = settings.client.pause(
        queue,
        task=task,
        ordering_key=ordering_key,
        reason=reason,
        actor=actor,
        cancel_running=cancel_running,
    )
    what = _scope_words(queue, task, ordering_key)
    if created:
        click.echo(f"{what} paused by {actor}")
    else:
        click.echo(f"{what} was already paused (kept as it was)")
    if cancel_running:
        click.echo("running jobs of it were asked to stop")


@click.command(params=_scope_options("Resume"))
@click.option("--reason", help="Why; kept in the audit trail.")
@actor_option("resumed")
@pass_settings
def resume(
    settings: Settings,
    queue: str | None,
    task: str | None,
    ordering_key: str | None,
    reason: str | None,
    actor: str,
) -> None:
    """End the pause of QUEUE (or --task / --ordering-key) and wake the workers."""
    _check_one_scope(queue, task, ordering_key)
    what = _scope_words(queue, task, ordering_key)
    if settings.client.resume(
        queue, task=task, ordering_key=ordering_key, reason=reason, actor=actor
    ):
        click.echo(f"{what} resumed by {actor}")
    else:
        click.echo(f"{what} was not paused")


@click.command("pauses")
@click.option("--json", "as_json", is_flag=True)
@pass_settings
def pauses_list(settings: Settings, as_json: bool) -> None:
    """The pauses in force: what, since when, by whom and why."""
    found = settings.reader.pauses()
    if as_json:
        emit_json([p.as_dict() for p in found])
        return
    if not found:
        click.echo("nothing is paused")
        return
    rows = [[p.scope, p.value, age(p.paused_for), p.paused_by or "-", p.reason] for p in found]
    click.echo(table(["scope", "value", "paused for", "by", "reason"], rows))


COMMANDS: tuple[click.Command, ...] = (pause, resume, pauses_list)
