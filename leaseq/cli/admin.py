"""The commands that run the installation: migrate, status (its own module,
``leaseq.cli.status``), prune, sweep, metrics (list, serve) and embedded (the development
server's status, stop). Each is a thin layer over the public client API."""

from __future__ import annotations

import time

import click
import psycopg
from prometheus_client import disable_created_metrics

from leaseq.cli.render import emit_json, table
from leaseq.cli.settings import DURATION, Settings, pass_settings
from leaseq.cli.status import status
from leaseq.db_metrics import database_registry
from leaseq.dev.embedded import EmbeddedServer, default_data_dir
from leaseq.errors import LeaseqError
from leaseq.metrics import METRICS
from leaseq.metrics_http import ObservabilityServer


@click.command()
@pass_settings
def migrate(settings: Settings) -> None:
    """Create or upgrade the schema (idempotent; safe to run concurrently)."""
    version = settings.client.migrate()
    click.echo(f"schema {settings.schema!r} is at version {version}")


@click.command()
@click.option("--older-than", type=DURATION, required=True, help="e.g. 7d")
@click.option(
    "--pause", type=float, default=0.05, show_default=True, help="Seconds between batches."
)
@pass_settings
def prune(settings: Settings, older_than: float, pause: float) -> None:
    """Delete succeeded and cancelled jobs finished more than --older-than ago."""
    done = settings.client.prune(older_than=older_than, pause=pause)
    click.echo(f"pruned {done} finished job(s)")


@click.command()
@pass_settings
def sweep(settings: Settings) -> None:
    """Recover expired leases now (workers also do this on their own)."""
    result = settings.client.sweep(actor="sweeper:cli")
    click.echo(f"requeued {result.requeued}, dead {result.dead}, cancelled {result.cancelled}")


@click.group()
def metrics() -> None:
    """Prometheus metrics: the table of names, and the database-side endpoint."""


@metrics.command("list")
@click.option("--json", "as_json", is_flag=True)
def metrics_list(as_json: bool) -> None:
    """Every metric leaseq exports: name, type, labels, where it comes from, meaning."""
    if as_json:
        emit_json([spec.__dict__ for spec in METRICS])
        return
    rows = [[m.name, m.kind, ",".join(m.labels) or "-", m.source, m.help] for m in METRICS]
    click.echo(table(["name", "type", "labels", "source", "meaning"], rows))


@metrics.command("serve")
@click.option("--port", type=int, default=9464, show_default=True)
@click.option("--host", default="127.0.0.1", show_default=True)
@pass_settings
def metrics_serve(settings: Settings, port: int, host: str) -> None:
    """Serve the database-derived metrics (ages, counts, dead jobs) until interrupted.

    Each scrape runs a few indexed queries (see the queue_stats view); safe every 15 s.
    With --read-dsn they run on the replica (lock waits and connections still come from
    the primary), and leaseq_read_replica_lag_seconds says how stale they may be."""
    # This process is leaseq's own: the *_created series would only double the scrape.
    disable_created_metrics()  # type: ignore[no-untyped-call]
    client = settings.reader
    client.check_schema()
    client.read_replica_lag()  # an unreachable --read-dsn fails here, in one line

    def ready() -> bool:
        try:
            client.schema_version()
        except (psycopg.Error, LeaseqError):
            return False
        return True

    registry = database_registry(
        lambda: (
            client.queue_stats(),
            {
                **client.database_health(),
                "pauses": client.pauses(),
                "limits": client.limits(),
                "replica_lag": client.read_replica_lag(),
            },
        )
    )
    server = ObservabilityServer(registry, port=port, host=host, ready=ready).start()
    click.echo(f"serving database metrics on http://{host}:{server.port}/metrics", err=True)
    try:
        while True:
            time.sleep(3600)
    finally:
        server.stop()


@click.group()
def embedded() -> None:
    """The private PostgreSQL used when no DSN is configured (or LEASEQ_DSN=embedded)."""


@embedded.command("status")
@click.option("--json", "as_json", is_flag=True)
def embedded_status(as_json: bool) -> None:
    """Whether the embedded server runs, where its data lives, its DSN."""
    info = EmbeddedServer(default_data_dir()).status()
    if as_json:
        emit_json({k: str(v) if v is not None else None for k, v in info.__dict__.items()})
        return
    state = "running" if info.running else "stopped"
    click.echo(f"embedded PostgreSQL: {state}")
    click.echo(f"data directory:      {info.data_dir}")
    if info.running:
        click.echo(f"pid:                 {info.pid}")
        click.echo(f"dsn:                 {info.dsn}")


@embedded.command("stop")
def embedded_stop() -> None:
    """Stop the embedded server (its data stays)."""
    stopped = EmbeddedServer(default_data_dir()).stop()
    click.echo("stopped" if stopped else "was not running")


COMMANDS: tuple[click.Command, ...] = (migrate, status, prune, sweep, metrics, embedded)
