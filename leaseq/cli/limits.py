"""The flow-control commands: ``leaseq limits set NAME``, ``leaseq limits remove NAME`` and
``leaseq limits list``, a thin layer over ``Client.set_limit`` / ``remove_limit`` /
``limits``; ``render_limits`` is also the block ``leaseq status`` shows under its table.
And fair queues: ``leaseq fair keys QUEUE``, ``leaseq fair weight QUEUE KEY WEIGHT``."""

from __future__ import annotations

from collections.abc import Sequence

import click

from leaseq.cli.render import age, emit_json, table
from leaseq.cli.settings import Settings, actor_option, pass_settings
from leaseq.errors import ConfigError
from leaseq.rules.fairness import TOP_KEYS
from leaseq.rules.limits import Limit, RateLimit


@click.group()
def limits() -> None:
    """Concurrency and rate limits (queue:NAME, task:NAME, key:KEY, key:PREFIX:*)."""


@limits.command("set")
@click.argument("name")
@click.option("--concurrency", type=int, help="At most this many of its jobs run at once.")
@click.option("--rate", type=float, help="At most this many claims per --per seconds.")
@click.option("--per", type=float, default=1.0, show_default=True, help="The rate's period.")
@click.option("--burst", type=int, help="Claims admitted back to back (default 1).")
@click.option("--reason", help="Why; kept in the audit trail.")
@actor_option("set it")
@pass_settings
def limits_set(
    settings: Settings,
    name: str,
    concurrency: int | None,
    rate: float | None,
    per: float,
    burst: int | None,
    reason: str | None,
    actor: str,
) -> None:
    """Set the limit NAME (replacing what was set); every worker obeys it from its next
    claim. E.g. `leaseq limits set queue:emails --concurrency 5`."""
    if rate is None and burst is not None:
        raise ConfigError("--burst needs --rate")
    bucket = None if rate is None else RateLimit(rate, per=per, burst=burst)
    settings.client.set_limit(
        name, concurrency=concurrency, rate=bucket, actor=actor, reason=reason
    )
    click.echo(f"limit {name} set by {actor}: {_describe(concurrency, bucket)}")


@limits.command("remove")
@click.argument("name")
@click.option("--reason", help="Why; kept in the audit trail.")
@actor_option("removed it")
@pass_settings
def limits_remove(settings: Settings, name: str, reason: str | None, actor: str) -> None:
    """Remove the limit NAME; running jobs give their slots back as they end."""
    if settings.client.remove_limit(name, actor=actor, reason=reason):
        click.echo(f"limit {name} removed by {actor}")
    else:
        click.echo(f"there was no limit {name}")


@limits.command("list")
@click.option("--json", "as_json", is_flag=True)
@pass_settings
def limits_list(settings: Settings, as_json: bool) -> None:
    """Each limit: slots in use, jobs waiting on it, its rate bucket, who set it."""
    found = settings.reader.limits()
    if as_json:
        emit_json([x.as_dict() for x in found])
        return
    click.echo(render_limits(found) if found else "no limits are set")


def _describe(concurrency: int | None, rate: RateLimit | None) -> str:
    parts = []
    if concurrency is not None:
        parts.append(f"concurrency {concurrency}")
    if rate is not None:
        parts.append(f"rate {rate.rate:g}/{rate.per:g}s burst {rate.burst_size}")
    return ", ".join(parts)


def render_limits(found: Sequence[Limit]) -> str:
    rows = [
        [
            x.name,
            "-" if x.concurrency is None else f"{x.in_use}/{x.concurrency}",
            "-" if x.waiting is None else x.waiting,
            "-" if x.rate is None else f"{x.rate:g}/{x.per_seconds:g}s burst {x.burst}",
            "-" if x.rate_wait is None else ("now" if x.rate_wait <= 0 else age(x.rate_wait)),
            x.updated_by or "-",
        ]
        for x in found
    ]
    return table(["limit", "slots", "waiting", "rate", "next token", "set by"], rows)


@click.group()
def fair() -> None:
    """Fair queues: each key's backlog, weight and share; weights (docs/fairness.md)."""


@fair.command("keys")
@click.argument("queue")
@click.option("--limit", type=int, default=TOP_KEYS, show_default=True, help="Keys shown.")
@click.option("--json", "as_json", is_flag=True, help="Print the keys as JSON.")
@pass_settings
def fair_keys(settings: Settings, queue: str, limit: int, as_json: bool) -> None:
    """The keys of the fair queue QUEUE, the largest backlogs first (key '': its jobs
    without a key)."""
    found = settings.client.fair_keys(queue, limit=limit)
    if as_json:
        emit_json([{**k.as_dict(), "share": k.share(found)} for k in found])
        return
    if not found:
        click.echo(f"queue {queue} has no fairness keys")
        return
    rows = [
        [
            k.key or "''",
            f"{k.weight:g}",
            k.backlog,
            k.running,
            f"{k.share(found):.1%}",
            "parked" if k.parked else "",
        ]
        for k in found
    ]
    click.echo(table(["key", "weight", "backlog", "running", "share", ""], rows))


@fair.command("weight")
@click.argument("queue")
@click.argument("key")
@click.argument("weight", type=float)
@click.option("--reason", help="Why; kept in the audit trail.")
@actor_option("set it")
@pass_settings
def fair_weight(
    settings: Settings, queue: str, key: str, weight: float, reason: str | None, actor: str
) -> None:
    """Give KEY of the fair queue QUEUE the weight WEIGHT (default 1): its share of the
    claims while several keys have work. Audited."""
    settings.client.set_fair_weight(queue, key, weight, actor=actor, reason=reason)
    click.echo(f"fairness weight of {queue}/{key} set to {weight:g} by {actor}")


COMMANDS: tuple[click.Command, ...] = (limits, fair)
