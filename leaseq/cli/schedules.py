"""``leaseq schedules``: list periodic schedules and their recent ticks, run one now, enable
or disable one, add, change and remove dynamic ones. Every change is audited (``--actor``,
``--reason``); every command takes ``--json``. A thin layer over the client's schedule
operations."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import click

from leaseq.cli.render import age, emit_json, table
from leaseq.cli.settings import DURATION, Failed, Settings, actor_option, pass_settings
from leaseq.errors import ConfigError
from leaseq.rules.schedule_timing import CATCH_UP_POLICIES, OVERLAP_POLICIES
from leaseq.rules.schedules import Schedule


@click.group()
def schedules() -> None:
    """Periodic schedules: list, ticks, run, enable, disable, add, change, remove."""


def _when(value: dt.datetime | None, now: dt.datetime) -> str:
    if value is None:
        return "-"
    delta = (value - now).total_seconds()
    return f"in {age(delta)}" if delta >= 0 else f"{age(-delta)} ago"


def _timing(s: Schedule) -> str:
    t = s.definition.timing
    if t.cron is not None:
        return t.cron + ("" if t.tz == "UTC" else f" ({t.tz})")
    return f"every {age(t.every)}"


@schedules.command("list")
@click.option("--json", "as_json", is_flag=True)
@pass_settings
def schedules_list(settings: Settings, as_json: bool) -> None:
    """Schedules with their next and last tick, policies and last job."""
    found = settings.reader.schedules()
    if as_json:
        emit_json([s.as_dict() for s in found])
        return
    if not found:
        click.echo("no schedules")
        return
    rows = [
        (
            s.name,
            s.definition.task,
            _timing(s),
            "yes" if s.enabled else "no",
            _when(s.next_tick, s.read_at) if s.enabled else "-",
            _when(s.last_tick, s.read_at),
            f"{s.definition.catch_up}/{s.definition.overlap}",
            "-" if s.last_job_id is None else f"{s.last_job_id} {s.last_job_status or 'gone'}",
            s.source,
        )
        for s in found
    ]
    headers = ("name", "task", "timing", "enabled", "next", "last", "catch-up/overlap")
    click.echo(table((*headers, "last job", "source"), rows))


@schedules.command("ticks")
@click.argument("name")
@click.option("--limit", type=int, default=20, show_default=True)
@click.option("--json", "as_json", is_flag=True)
@pass_settings
def schedules_ticks(settings: Settings, name: str, limit: int, as_json: bool) -> None:
    """The most recent ticks of schedule NAME: their job, or why they were skipped."""
    client = settings.reader
    if not client.schedules(name):
        raise Failed(f"no schedule named {name!r}")
    found = client.schedule_ticks(name, limit=limit)
    if as_json:
        emit_json(
            [
                {
                    "tick_at": t.tick_at.isoformat(),
                    "job_id": t.job_id,
                    "catch_up": t.catch_up,
                    "manual": t.manual,
                    "skipped": t.skipped,
                }
                for t in found
            ]
        )
        return
    rows = [
        (
            t.tick_at.astimezone(dt.UTC).isoformat(),
            "-" if t.job_id is None else t.job_id,
            "manual" if t.manual else "catch-up" if t.catch_up else "on time",
            t.skipped or "",
        )
        for t in found
    ]
    click.echo(table(("tick (UTC)", "job", "run", "skipped"), rows) if rows else "no ticks yet")


@schedules.command("run")
@click.argument("name")
@click.option("--reason", default=None, help="Why; kept in the audit trail.")
@actor_option("runs it")
@click.option("--json", "as_json", is_flag=True)
@pass_settings
def schedules_run(
    settings: Settings, name: str, reason: str | None, actor: str, as_json: bool
) -> None:
    """Enqueue one job of schedule NAME now (audited); its timing is unchanged."""
    job_id = settings.client.schedule_run_now(name, reason=reason, actor=actor)
    if as_json:
        emit_json({"name": name, "job_id": job_id})
    else:
        click.echo(f"schedule {name}: enqueued job {job_id}")


def _toggle(
    settings: Settings, name: str, enable: bool, reason: str, actor: str, as_json: bool
) -> None:
    client = settings.client
    if not client.schedules(name):
        raise Failed(f"no schedule named {name!r}")
    call = client.schedule_enable if enable else client.schedule_disable
    changed = call(name, reason=reason, actor=actor)
    state = "enabled" if enable else "disabled"
    if as_json:
        emit_json({"name": name, "enabled": enable, "changed": changed})
    elif changed:
        click.echo(f"schedule {name} {state} by {actor}")
    else:
        click.echo(f"schedule {name} was already {state}")


@schedules.command("enable")
@click.argument("name")
@click.option("--reason", required=True, help="Why; kept in the audit trail.")
@actor_option("enables it")
@click.option("--json", "as_json", is_flag=True)
@pass_settings
def schedules_enable(settings: Settings, name: str, reason: str, actor: str, as_json: bool) -> None:
    """Enable schedule NAME (ticks missed while disabled are not caught up)."""
    _toggle(settings, name, True, reason, actor, as_json)


@schedules.command("disable")
@click.argument("name")
@click.option("--reason", required=True, help="Why; kept in the audit trail.")
@actor_option("disables it")
@click.option("--json", "as_json", is_flag=True)
@pass_settings
def schedules_disable(
    settings: Settings, name: str, reason: str, actor: str, as_json: bool
) -> None:
    """Disable schedule NAME: no tick creates a job until it is enabled again."""
    _toggle(settings, name, False, reason, actor, as_json)


def _payload(text: str | None) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"payload is not valid JSON: {exc}") from None


def _timing_options(f: Any) -> Any:
    for option in reversed(
        (
            click.option("--cron", default=None, help="5 fields, or 6 with leading seconds."),
            click.option("--every", type=DURATION, default=None, help="Interval, e.g. 30s, 1h."),
            click.option("--tz", default=None, help="IANA time zone of --cron (default UTC)."),
            click.option("--payload", default=None, help="The jobs' payload, as JSON."),
            click.option("--queue", default=None),
            click.option("--priority", type=int, default=None),
            click.option("--catch-up", type=click.Choice(CATCH_UP_POLICIES), default=None),
            click.option("--catch-up-max", type=int, default=None),
            click.option("--grace", type=DURATION, default=None, help="For --catch-up latest."),
            click.option("--overlap", type=click.Choice(OVERLAP_POLICIES), default=None),
        )
    ):
        f = option(f)
    return f


@schedules.command("add")
@click.argument("name")
@click.option("--task", required=True)
@_timing_options
@click.option("--reason", default=None, help="Why; kept in the audit trail.")
@actor_option("adds it")
@click.option("--json", "as_json", is_flag=True)
@pass_settings
def schedules_add(
    settings: Settings, /, name: str, task: str, reason: str | None, actor: str, as_json: bool,
    **options: Any,
) -> None:  # fmt: skip
    """Add a dynamic schedule NAME enqueuing TASK by --cron or --every."""
    options["payload"] = _payload(options["payload"])
    given = {k: v for k, v in options.items() if v is not None}
    added = settings.client.schedule_add(name, task=task, reason=reason, actor=actor, **given)
    if as_json:
        emit_json(added.as_dict())
    else:
        click.echo(f"schedule {name} added; next tick {added.next_tick.isoformat()}")


@schedules.command("change")
@click.argument("name")
@click.option("--task", default=None)
@_timing_options
@click.option("--reason", default=None, help="Why; kept in the audit trail.")
@actor_option("changes it")
@click.option("--json", "as_json", is_flag=True)
@pass_settings
def schedules_change(
    settings: Settings, /, name: str, reason: str | None, actor: str, as_json: bool,
    **options: Any,
) -> None:  # fmt: skip
    """Change a dynamic schedule NAME (what is not given stays)."""
    options["payload"] = _payload(options["payload"])
    new = settings.client.schedule_change(name, reason=reason, actor=actor, **options)
    if as_json:
        emit_json(new.as_dict())
    else:
        click.echo(f"schedule {name} changed; next tick {new.next_tick.isoformat()}")


@schedules.command("remove")
@click.argument("name")
@click.option("--reason", required=True, help="Why; kept in the audit trail.")
@actor_option("removes it")
@click.option("--json", "as_json", is_flag=True)
@pass_settings
def schedules_remove(settings: Settings, name: str, reason: str, actor: str, as_json: bool) -> None:
    """Delete a dynamic schedule NAME and its tick history (its jobs stay)."""
    if not settings.client.schedule_remove(name, reason=reason, actor=actor):
        raise Failed(f"no schedule named {name!r}")
    if as_json:
        emit_json({"name": name, "removed": True})
    else:
        click.echo(f"schedule {name} removed by {actor}")
