"""``leaseq status``: per-queue counts, the limits, and, with ``--read-dsn``, which server
answered the reads and how far that replica is behind the primary.

The replica's lag is the one reading ``leaseq_read_replica_lag_seconds`` and the dashboard
also show (``Client.read_replica_lag``). It is unknown, not an error, while the primary does
not answer: the counts came from the replica and still stand. ``ops`` lists this command
with the other operator commands."""

from __future__ import annotations

import time
from typing import Any

import click
import psycopg

from leaseq.cli.durable import suspended_lines
from leaseq.cli.limits import render_limits
from leaseq.cli.render import emit_json, render_status
from leaseq.cli.settings import Settings, pass_settings
from leaseq.client import Client
from leaseq.errors import LeaseqError
from leaseq.rules.replicas import ReplicaLag, reads_from_line, replica_report, unknown_lag_line


def read_lag(reader: Client) -> tuple[ReplicaLag | None, BaseException | None]:
    """The replica's lag, or why it could not be read (the primary or the replica did not
    answer)."""
    try:
        return reader.read_replica_lag(), None
    except (psycopg.Error, LeaseqError) as exc:
        return None, exc


def replica_lines(read_dsn: str, reader: Client) -> list[str]:
    """The plain output's last lines: the server that answered, then its lag (last)."""
    lag, error = read_lag(reader)
    if error is not None:
        return [reads_from_line(read_dsn, None), unknown_lag_line(error)]
    assert lag is not None  # a client given a read DSN always measures one
    return [reads_from_line(read_dsn, lag), lag.describe()]


def status_json(settings: Settings, reader: Client) -> list[dict[str, Any]]:
    """One object per queue, as always; with a read DSN each also carries ``read_replica``
    (keys are only ever added: a consumer of the plain list keeps working)."""
    stats = reader.queue_stats(throughput=True)
    paused = {p.value for p in reader.pauses() if p.scope == "queue"}
    suspended: dict[str, int] = {}
    for found in reader.suspended_stats():
        suspended[found.queue] = suspended.get(found.queue, 0) + found.count
    rows = [
        {**s.as_dict(), "paused": s.queue in paused, "suspended": suspended.get(s.queue, 0)}
        for s in stats
    ]
    if settings.read_dsn is not None:
        lag, error = read_lag(reader)
        report = replica_report(settings.read_dsn, lag, error)
        rows = [{**row, "read_replica": report} for row in rows]
    return rows


@click.command()
@click.option("--json", "as_json", is_flag=True)
@click.option("--watch", is_flag=True, help="Refresh every --interval seconds until Ctrl-C.")
@click.option("--interval", type=float, default=2.0, show_default=True)
@pass_settings
def status(settings: Settings, as_json: bool, watch: bool, interval: float) -> None:
    """Per-queue counts and the age of the oldest claimable job; paused queues marked;
    then the limits, with their slots in use and jobs waiting, and the suspended jobs.
    With --read-dsn, read on the replica: the last lines name the server that answered
    and its lag behind the primary (in --json, each queue's "read_replica")."""
    reader = settings.reader
    while True:
        if as_json:
            emit_json(status_json(settings, reader))
        else:
            stats = reader.queue_stats(throughput=True)
            pauses = reader.pauses()
            if watch:
                click.clear()
            click.echo(render_status(stats, pauses))
            if found := reader.limits():
                click.echo("\n" + render_limits(found))
            for line in suspended_lines(reader):
                click.echo(line)
            if settings.read_dsn is not None:
                click.echo("\n" + "\n".join(replica_lines(settings.read_dsn, reader)))
        if not watch:
            return
        time.sleep(interval)
