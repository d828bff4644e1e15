"""The ``leaseq`` command line, built only on the public API.

Every error a person can cause (bad argument, bad DSN, unknown job) ends as one line on
stderr and a non-zero exit code, never as a traceback:

- 0: done; 1: the operation could not be done (database down, job not in that state);
- 2: bad usage or configuration; 130: interrupted.
"""

from __future__ import annotations

import datetime as dt
import importlib
import json
import logging
import os
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NoReturn

import click
import psycopg

from leaseq import validate
from leaseq.app import App
from leaseq.client import Client
from leaseq.errors import ConfigError, LeaseqError
from leaseq.logs import configure as configure_logging
from leaseq.models import Job, QueueStats
from leaseq.worker import QueueSettings, WorkerConfig, run_worker
from leaseq.worker.runner import exit_code
from leaseq.worker.supervisor import Supervisor, child_command

EXIT_FAILED = 1
EXIT_USAGE = 2


class Failed(click.ClickException):
    """The command was understood but could not be carried out."""

    exit_code = EXIT_FAILED


class Settings:
    def __init__(self, dsn: str | None, schema: str, prepare: bool = True) -> None:
        self.dsn = dsn
        self.schema = schema
        self.prepare = prepare
        self._client: Client | None = None

    @property
    def client(self) -> Client:
        if self._client is None:
            self._client = Client(self.dsn, schema=self.schema, pool_size=2, prepare=self.prepare)
        return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()


pass_settings = click.make_pass_decorator(Settings)


if TYPE_CHECKING:
    _FloatParam = click.ParamType[float]
else:  # click < 8.3 has no generic ParamType at run time
    _FloatParam = click.ParamType


class Duration(_FloatParam):
    """A duration such as 90s, 15m, 2h, 7d (seconds when bare)."""

    name = "duration"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        if isinstance(value, int | float):
            return float(value)
        try:
            return validate.parse_duration(value)
        except ConfigError as exc:
            self.fail(str(exc), param, ctx)


DURATION = Duration()


def _emit_json(value: Any) -> None:
    click.echo(json.dumps(value, indent=2, default=str))


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.1f}s"
    if seconds < 7200:
        return f"{seconds / 60:.1f}m"
    return f"{seconds / 3600:.1f}h"


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(line.rstrip() for line in lines)


def render_status(stats: Sequence[QueueStats]) -> str:
    if not stats:
        return "no pending, running or dead jobs"
    headers = [
        "queue",
        "ready",
        "scheduled",
        "running",
        "dead",
        "oldest ready",
        "oldest dead",
        "done/min",
    ]
    rows = [
        [
            s.queue,
            s.ready,
            s.scheduled,
            s.running,
            s.dead,
            _age(s.oldest_ready_age) if s.ready else "-",
            _age(s.oldest_dead_age) if s.dead else "-",
            "-" if s.finished_recently is None else s.finished_recently,
        ]
        for s in stats
    ]
    return _table(headers, rows)


@click.group(
    context_settings={"help_option_names": ["-h", "--help"], "auto_envvar_prefix": "LEASEQ"}
)
@click.option(
    "--dsn",
    envvar="LEASEQ_DSN",
    help="PostgreSQL connection string (env LEASEQ_DSN). Default: the embedded server.",
)
@click.option(
    "--schema",
    envvar="LEASEQ_SCHEMA",
    default="leaseq",
    show_default=True,
    help="Schema holding leaseq's tables (env LEASEQ_SCHEMA).",
)
@click.option(
    "-v", "--verbose", count=True, help="Log more: -v progress and failures, -vv every job."
)
@click.option(
    "--log-format",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="json: one object per line, job fields (job_id, task, queue, attempt, token) included.",
)
@click.option(
    "--no-prepare",
    is_flag=True,
    help="No server-side prepared statements (PgBouncer in transaction pooling mode).",
)
@click.version_option(package_name="leaseq")
@click.pass_context
def cli(
    ctx: click.Context,
    dsn: str | None,
    schema: str,
    verbose: int,
    log_format: str,
    no_prepare: bool,
) -> None:
    """leaseq: a PostgreSQL job queue with fenced, expiring leases."""
    level = {0: logging.WARNING, 1: logging.INFO}.get(verbose, logging.DEBUG)
    configure_logging(level=level, json_format=log_format == "json")
    settings = Settings(dsn, schema, prepare=not no_prepare)
    ctx.obj = settings
    ctx.call_on_close(settings.close)


@cli.command()
@pass_settings
def migrate(settings: Settings) -> None:
    """Create or upgrade the schema (idempotent; safe to run concurrently)."""
    version = settings.client.migrate()
    click.echo(f"schema {settings.schema!r} is at version {version}")


def _parse_payload(text: str | None) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise click.BadParameter(f"not valid JSON ({exc.msg} at column {exc.colno})") from None


@cli.command()
@click.argument("task")
@click.argument("payload", required=False)
@click.option("--queue", "-q", default="default", show_default=True)
@click.option("--priority", type=int, default=0, show_default=True)
@click.option("--delay", type=float, default=None, help="Seconds from now (database clock).")
@click.option("--max-attempts", type=int, default=8, show_default=True)
@click.option("--ordering-key", default=None, help="Run after earlier jobs of this key.")
@click.option("--json", "as_json", is_flag=True, help="Print {'id': ...} as JSON.")
@pass_settings
def enqueue(
    settings: Settings,
    task: str,
    payload: str | None,
    queue: str,
    priority: int,
    delay: float | None,
    max_attempts: int,
    ordering_key: str | None,
    as_json: bool,
) -> None:
    """Enqueue TASK with an optional JSON PAYLOAD; prints the job id."""
    job_id = settings.client.enqueue(
        task,
        _parse_payload(payload),
        queue=queue,
        priority=priority,
        delay=delay,
        max_attempts=max_attempts,
        ordering_key=ordering_key,
    )
    if as_json:
        _emit_json({"id": job_id})
    else:
        click.echo(job_id)


def load_app(ref: str) -> App:
    """Import ``module:attribute`` (the current directory is importable) and check it is an App."""
    module_name, _, attr = ref.partition(":")
    if not module_name or not attr:
        raise ConfigError(f"expected MODULE:APP (e.g. myproject.jobs:app), got {ref!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"cannot import {module_name!r}: {exc}") from None
    app = getattr(module, attr, None)
    if not isinstance(app, App):
        raise ConfigError(f"{ref} is not a leaseq.App (found {type(app).__name__})")
    return app


def _queue_settings(specs: tuple[str, ...], app: App, any_queue: bool) -> tuple[QueueSettings, ...]:
    queues = tuple(QueueSettings.parse(spec) for spec in specs) or (QueueSettings("default"),)
    known = {task.queue for task in app.tasks.values()}
    unknown = [q.name for q in queues if q.name not in known]
    if unknown and not any_queue:
        raise ConfigError(
            f"queue {unknown[0]!r} is not used by any task of this app (its tasks use: "
            f"{', '.join(sorted(known)) or 'none'}); pass --any-queue to serve it anyway"
        )
    return queues


@cli.command()
@click.argument("app_ref", metavar="MODULE:APP")
@click.option(
    "--queue",
    "-q",
    "queues",
    multiple=True,
    help=(
        "Queue to serve, repeatable: NAME[=WEIGHT][:lease=SECONDS,batch=N]; weights split "
        "the slots between queues that all have work. Default: default."
    ),
)
@click.option("--any-queue", is_flag=True, help="Allow queues no task of the app declares.")
@click.option("--concurrency", "-c", type=int, default=10, show_default=True)
@click.option(
    "--prefetch", type=int, default=0, show_default=True, help="Leases held beyond free slots."
)
@click.option(
    "--processes",
    "-p",
    type=int,
    default=1,
    show_default=True,
    help="Supervise N worker processes.",
)
@click.option("--lease-seconds", type=float, default=60.0, show_default=True)
@click.option("--batch-size", type=int, default=100, show_default=True)
@click.option(
    "--claims-in-flight",
    type=int,
    default=2,
    show_default=True,
    help="Claim statements at once while the queues are busy.",
)
@click.option("--poll-interval", type=float, default=2.0, show_default=True)
@click.option("--sweep-interval", type=float, default=15.0, show_default=True)
@click.option("--shutdown-timeout", type=float, default=30.0, show_default=True)
@click.option("--op-timeout", type=float, default=10.0, show_default=True)
@click.option(
    "--retention",
    default="7d",
    show_default=True,
    help="Prune succeeded/cancelled jobs older than this (e.g. 1d), or 'never'.",
)
@click.option(
    "--prune-interval",
    type=DURATION,
    default="60s",
    show_default=True,
    help="How often the worker prunes (until nothing is left).",
)
@click.option(
    "--prune-share",
    type=float,
    default=0.2,
    show_default=True,
    help="Most of the time pruning may spend deleting (paced batches).",
)
@click.option(
    "--priority-aging",
    type=DURATION,
    default=None,
    help="Raise a waiting job's priority by 1 per this much waiting (e.g. 30s). Default: off.",
)
@click.option("--metrics-port", type=int, default=None, help="Serve /metrics, /healthz, /readyz.")
@click.option("--metrics-host", default="127.0.0.1", show_default=True)
@click.option("--no-listen", is_flag=True, help="Do not LISTEN; rely on polling only.")
@click.option(
    "--listen-dsn",
    default=None,
    help="LISTEN over this direct connection (e.g. around PgBouncer); default: --dsn.",
)
@click.option("--burst", is_flag=True, help="Exit once nothing is claimable and nothing runs.")
@click.option("--drain", is_flag=True, help="Exit once the queues have no pending job at all.")
@click.option("--worker-id", default=None, help="Lease owner name (default host:pid:random).")
@pass_settings
def worker(
    settings: Settings,
    app_ref: str,
    queues: tuple[str, ...],
    any_queue: bool,
    concurrency: int,
    prefetch: int,
    processes: int,
    lease_seconds: float,
    batch_size: int,
    claims_in_flight: int,
    poll_interval: float,
    sweep_interval: float,
    shutdown_timeout: float,
    op_timeout: float,
    retention: str,
    prune_interval: float,
    prune_share: float,
    priority_aging: float | None,
    metrics_port: int | None,
    metrics_host: str,
    no_listen: bool,
    listen_dsn: str | None,
    burst: bool,
    drain: bool,
    worker_id: str | None,
) -> None:
    """Run a worker for the tasks of MODULE:APP until stopped (SIGTERM/SIGINT).

    Every option can also come from the environment: LEASEQ_WORKER_<OPTION>, e.g.
    LEASEQ_WORKER_CONCURRENCY=20. Exit codes: 0 clean stop, 3 running jobs had to be
    abandoned at shutdown (they are retried), 1 error, 2 bad configuration.
    """
    app = load_app(app_ref)
    app.prepare = app.prepare and settings.prepare
    if settings.dsn:
        app.dsn = settings.dsn
    if settings.schema != "leaseq" or app.schema == "leaseq":
        app.schema = settings.schema
    extra: dict[str, Any] = {"worker_id": worker_id} if worker_id else {}
    config = WorkerConfig(
        queues=_queue_settings(queues, app, any_queue),
        concurrency=concurrency,
        prefetch=prefetch,
        lease_seconds=lease_seconds,
        batch_size=batch_size,
        claims_in_flight=claims_in_flight,
        poll_interval=poll_interval,
        sweep_interval=sweep_interval,
        shutdown_timeout=shutdown_timeout,
        op_timeout=op_timeout,
        retention=None if retention == "never" else validate.parse_duration(retention),
        prune_interval=prune_interval,
        prune_share=prune_share,
        listen=not no_listen,
        listen_dsn=listen_dsn,
        priority_aging=priority_aging,
        metrics_port=metrics_port,
        metrics_host=metrics_host,
        burst=burst,
        drain=drain,
        **extra,
    )
    validate.check_int("processes", processes, 1, 256)
    if processes > 1:
        if worker_id:
            raise ConfigError("--worker-id names one process; it cannot be used with --processes")
        command = [sys.executable, "-m", "leaseq", *child_command(sys.argv[1:])]
        sys.exit(Supervisor(command, processes, restart=not (burst or drain)).run())
    started = time.monotonic()
    stats = run_worker(app, config)
    elapsed = time.monotonic() - started
    if burst or drain:
        done = stats.succeeded + stats.failed
        click.echo(
            f"processed {done} job(s) in {elapsed:.2f}s ({done / elapsed:.0f}/s): "
            f"{stats.succeeded} succeeded, {stats.failed} failed, "
            f"{stats.lost_leases + stats.lost_fence_writes} lost lease(s)"
        )
    # Exit without joining handler threads: a sync handler that was abandoned (shutdown
    # timeout, second signal, max_runtime) may still be running, and its result is
    # discarded anyway. Everything the database needed has been written by now.
    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()
    os._exit(exit_code(stats))


@cli.command()
@click.option("--json", "as_json", is_flag=True)
@click.option("--watch", is_flag=True, help="Refresh every --interval seconds until Ctrl-C.")
@click.option("--interval", type=float, default=2.0, show_default=True)
@pass_settings
def status(settings: Settings, as_json: bool, watch: bool, interval: float) -> None:
    """Per-queue counts and the age of the oldest claimable job."""
    while True:
        stats = settings.client.queue_stats(throughput=True)
        if as_json:
            _emit_json([s.as_dict() for s in stats])
        else:
            if watch:
                click.clear()
            click.echo(render_status(stats))
        if not watch:
            return
        time.sleep(interval)


@cli.group()
def jobs() -> None:
    """Inspect single jobs."""


def _job_lines(job: Job) -> list[str]:
    fields = job.as_dict()
    payload = json.dumps(fields.pop("payload"), default=str)
    lines = [f"{k:20} {v}" for k, v in fields.items() if k != "last_error_detail"]
    lines.append(f"{'payload':20} {payload if len(payload) <= 500 else payload[:497] + '...'}")
    if job.last_error_detail:
        lines.append("last_error_detail:")
        lines.extend("  " + line for line in job.last_error_detail.splitlines())
    return lines


@jobs.command("show")
@click.argument("job_id", type=int)
@click.option("--json", "as_json", is_flag=True)
@pass_settings
def jobs_show(settings: Settings, job_id: int, as_json: bool) -> None:
    """A job's row and its full history of transitions."""
    job = settings.client.get_job(job_id)
    if job is None:
        raise Failed(f"no job with id {job_id}")
    events = settings.client.job_events(job_id)
    effects = settings.client.job_effects(job_id)
    if as_json:
        _emit_json(
            {
                "job": job.as_dict(),
                "events": [e.as_dict() for e in events],
                "effects": [f.as_dict() for f in effects],
            }
        )
        return
    click.echo("\n".join(_job_lines(job)))
    click.echo("\nhistory:")
    if not events:
        click.echo("  (no transitions besides claim/succeed)")
    rows = [
        [
            e.at.isoformat(timespec="seconds"),
            e.event,
            f"{e.from_status}->{e.to_status}",
            e.actor or "-",
            e.lease_token if e.lease_token is not None else "-",
            e.attempt if e.attempt is not None else "-",
            e.error_code or "-",
            (e.detail or "").splitlines()[0][:60] if e.detail else "-",
        ]
        for e in events
    ]
    if rows:
        headers = ["at", "event", "transition", "actor", "token", "attempt", "code", "detail"]
        click.echo(_table(headers, rows))
    if effects:
        click.echo("\neffects:")
        state = {"started": "started (uncertain if the attempt ended)", "done": "done"}
        effect_rows = [
            [
                f.name + (f":{f.key}" if f.key else ""),
                state.get(f.status, f.status),
                f.attempt,
                f.lease_token,
                f.started_at.isoformat(timespec="seconds"),
                (f.error or "").splitlines()[0][:60] if f.error else "-",
            ]
            for f in effects
        ]
        click.echo(
            _table(["effect", "status", "attempt", "token", "started", "error"], effect_rows)
        )


@cli.group()
def dead() -> None:
    """Dead jobs: kept, inspectable, replayable."""


def job_filters(func: Any) -> Any:
    """The operator filter: queue, task, error code, age since the job finished."""
    for option in reversed(
        [
            click.option("--queue", "-q", default=None, help="Only this queue."),
            click.option("--task", default=None, help="Only this task."),
            click.option("--error-code", default=None, help="Only this last error code."),
            click.option(
                "--older-than", type=DURATION, default=None, help="Finished before, e.g. 2h."
            ),
            click.option(
                "--newer-than", type=DURATION, default=None, help="Finished within, e.g. 30m."
            ),
        ]
    ):
        func = option(func)
    return func


@dead.command("list")
@job_filters
@click.option("--limit", type=int, default=100, show_default=True)
@click.option("--json", "as_json", is_flag=True)
@pass_settings
def dead_list(settings: Settings, /, limit: int, as_json: bool, **filters: Any) -> None:
    """List dead jobs, newest first."""
    found = settings.client.list_jobs("dead", limit=limit, **filters)
    if as_json:
        _emit_json([j.as_dict() for j in found])
        return
    if not found:
        click.echo("no dead jobs")
        return
    now = dt.datetime.now(dt.UTC)
    rows = [
        [
            j.job_id,
            j.queue,
            j.task,
            j.last_error_code or "-",
            j.last_error_class or "-",
            j.attempt_count,
            _age((now - j.finished_at).total_seconds()) if j.finished_at else "-",
        ]
        for j in found
    ]
    click.echo(_table(["id", "queue", "task", "error", "class", "attempts", "dead for"], rows))
    total = settings.client.count_jobs("dead", **filters)
    if total > len(found):
        click.echo(f"({len(found)} of {total} shown; use --limit)")


@dead.command("purge")
@job_filters
@click.option("--reason", required=True, help="Why they are removed; kept in the audit trail.")
@click.option("--actor", default=None, help="Who purges (default: $USER).")
@click.option("--dry-run", is_flag=True, help="Only count what would be purged.")
@pass_settings
def dead_purge(
    settings: Settings, /, reason: str, actor: str | None, dry_run: bool, **filters: Any
) -> None:
    """Delete dead jobs (their audit trail stays, ending in a 'purged' row)."""
    if filters["newer_than"] is not None:
        raise ConfigError("purge takes --older-than, not --newer-than")
    del filters["newer_than"]
    if not any(v is not None for v in filters.values()):
        raise ConfigError("purge needs a filter (e.g. --older-than 30d); it will not purge all")
    count = settings.client.count_jobs("dead", **filters)
    if dry_run:
        click.echo(f"would purge {count} dead job(s)")
        return
    who = actor or os.environ.get("USER") or "operator"
    with click.progressbar(length=count, label="purging", file=sys.stderr) as bar:
        done = settings.client.purge_dead(
            reason=reason, actor=who, on_progress=bar.update, **filters
        )
    click.echo(f"purged {done} dead job(s)")


@cli.command()
@click.argument("job_id", type=int, required=False)
@click.option("--reason", required=True, help="What was fixed; stored in the audit trail.")
@click.option("--actor", default=None, help="Who replays (default: $USER).")
@click.option("--allow-cancelled", is_flag=True, help="Also replay cancelled jobs.")
@job_filters
@click.option("--all", "everything", is_flag=True, help="Bulk: every dead job (no filter).")
@click.option("--dry-run", is_flag=True, help="Bulk: only count what would be replayed.")
@pass_settings
def replay(
    settings: Settings,
    /,
    job_id: int | None,
    reason: str,
    actor: str | None,
    allow_cancelled: bool,
    everything: bool,
    dry_run: bool,
    **filters: Any,
) -> None:
    """Bring dead jobs back to pending under the same ids (audited).

    One job: `replay ID --reason ...`. Many: `replay --error-code TIMEOUT --reason ...`
    (any of the filters, or --all), with --dry-run to count first.
    """
    who = actor or os.environ.get("USER") or "operator"
    client = settings.client
    has_filter = any(v is not None for v in filters.values())
    if job_id is not None:
        if has_filter or everything or dry_run:
            raise ConfigError("give a job id or bulk filters, not both")
        if client.replay(job_id, reason=reason, actor=who, allow_cancelled=allow_cancelled):
            click.echo(f"job {job_id} replayed by {who}")
            return
        job = client.get_job(job_id)
        if job is None:
            raise Failed(f"no job with id {job_id}")
        allowed = "dead or cancelled" if allow_cancelled else "dead"
        raise Failed(
            f"job {job_id} is {job.status}, not {allowed}; only {allowed} jobs can be replayed"
        )
    if not (has_filter or everything):
        raise ConfigError("give a job id, or bulk filters (--queue, --error-code, ...) or --all")
    statuses = ["dead", "cancelled"] if allow_cancelled else ["dead"]
    count = sum(client.count_jobs(status, **filters) for status in statuses)
    if dry_run:
        click.echo(f"would replay {count} job(s)")
        return
    with click.progressbar(length=count, label="replaying", file=sys.stderr) as bar:
        done = client.replay_many(
            reason=reason,
            actor=who,
            allow_cancelled=allow_cancelled,
            on_progress=bar.update,
            **filters,
        )
    click.echo(f"replayed {done} job(s) by {who}")


@cli.command()
@click.option("--older-than", type=DURATION, required=True, help="e.g. 7d")
@click.option(
    "--pause", type=float, default=0.05, show_default=True, help="Seconds between batches."
)
@pass_settings
def prune(settings: Settings, older_than: float, pause: float) -> None:
    """Delete succeeded and cancelled jobs finished more than --older-than ago."""
    done = settings.client.prune(older_than=older_than, pause=pause)
    click.echo(f"pruned {done} finished job(s)")


@cli.command()
@click.argument("job_id", type=int)
@click.option("--reason", default=None)
@pass_settings
def cancel(settings: Settings, job_id: int, reason: str | None) -> None:
    """Cancel a pending job, or ask the worker running it to stop."""
    who = os.environ.get("USER") or "operator"
    if settings.client.cancel(job_id, actor=who, reason=reason):
        job = settings.client.get_job(job_id)
        state = "cancelled" if job and job.status == "cancelled" else "cancel requested"
        click.echo(f"job {job_id}: {state}")
        return
    job = settings.client.get_job(job_id)
    if job is None:
        raise Failed(f"no job with id {job_id}")
    raise Failed(f"job {job_id} is already {job.status}; nothing to cancel")


@cli.command()
@pass_settings
def sweep(settings: Settings) -> None:
    """Recover expired leases now (workers also do this on their own)."""
    result = settings.client.sweep(actor="sweeper:cli")
    click.echo(f"requeued {result.requeued}, dead {result.dead}, cancelled {result.cancelled}")


@cli.command()
@click.option("--jobs", "count", type=int, default=40, show_default=True)
@click.option("--schema", "demo_schema", default="leaseq_demo", show_default=True)
@pass_settings
def demo(settings: Settings, count: int, demo_schema: str) -> None:
    """Migrate, enqueue a mixed batch, drain it with a worker, print the status."""
    from leaseq import demo as demo_module

    demo_module.run(settings.dsn, schema=demo_schema, count=count, echo=click.echo)


@cli.group()
def keys() -> None:
    """Ordering keys: which are blocked by a dead head, and moving past one."""


@keys.command("blocked")
@click.option("--limit", type=int, default=100, show_default=True)
@click.option("--json", "as_json", is_flag=True)
@pass_settings
def keys_blocked(settings: Settings, limit: int, as_json: bool) -> None:
    """Keys whose head job is dead (policy block): later jobs of the key wait for it."""
    found = settings.client.blocked_keys(limit=limit)
    if as_json:
        _emit_json([k.as_dict() for k in found])
        return
    if not found:
        click.echo("no blocked keys")
        return
    now = dt.datetime.now(dt.UTC)
    rows = [
        [
            k.key,
            k.head_job_id,
            k.task,
            k.error_code or "-",
            _age((now - k.dead_since).total_seconds()) if k.dead_since else "-",
            k.waiting,
        ]
        for k in found
    ]
    click.echo(_table(["key", "dead head", "task", "error", "dead for", "waiting"], rows))
    click.echo("replay the head (leaseq replay ID) or skip it (leaseq keys skip ID --reason ...)")


@keys.command("skip")
@click.argument("job_id", type=int)
@click.option("--reason", required=True, help="Why the key may move on; kept in the trail.")
@click.option("--actor", default=None, help="Who skips (default: $USER).")
@pass_settings
def keys_skip(settings: Settings, job_id: int, reason: str, actor: str | None) -> None:
    """Let a key move past its dead head JOB_ID (the head stays dead, replayable)."""
    who = actor or os.environ.get("USER") or "operator"
    if settings.client.skip_dead_head(job_id, reason=reason, actor=who):
        click.echo(f"job {job_id} skipped by {who}; its key moves on")
        return
    job = settings.client.get_job(job_id)
    if job is None:
        raise Failed(f"no job with id {job_id}")
    raise Failed(f"job {job_id} is not a dead head of an ordering key (it is {job.status})")


@cli.group()
def metrics() -> None:
    """Prometheus metrics: the table of names, and the database-side endpoint."""


@metrics.command("list")
@click.option("--json", "as_json", is_flag=True)
def metrics_list(as_json: bool) -> None:
    """Every metric leaseq exports: name, type, labels, where it comes from, meaning."""
    from leaseq.metrics import METRICS

    if as_json:
        _emit_json([spec.__dict__ for spec in METRICS])
        return
    rows = [[m.name, m.kind, ",".join(m.labels) or "-", m.source, m.help] for m in METRICS]
    click.echo(_table(["name", "type", "labels", "source", "meaning"], rows))


@metrics.command("serve")
@click.option("--port", type=int, default=9464, show_default=True)
@click.option("--host", default="127.0.0.1", show_default=True)
@pass_settings
def metrics_serve(settings: Settings, port: int, host: str) -> None:
    """Serve the database-derived metrics (ages, counts, dead jobs) until interrupted.

    Each scrape runs a few indexed queries (see the queue_stats view); safe every 15 s."""
    from leaseq.metrics import database_registry
    from leaseq.observe import ObservabilityServer

    client = settings.client
    client.check_schema()

    def ready() -> bool:
        try:
            client.schema_version()
        except (psycopg.Error, LeaseqError):
            return False
        return True

    registry = database_registry(lambda: (client.queue_stats(), client.database_health()))
    server = ObservabilityServer(registry, port=port, host=host, ready=ready).start()
    click.echo(f"serving database metrics on http://{host}:{server.port}/metrics", err=True)
    try:
        while True:
            time.sleep(3600)
    finally:
        server.stop()


@cli.group()
def embedded() -> None:
    """The private PostgreSQL used when no DSN is configured."""


@embedded.command("status")
@click.option("--json", "as_json", is_flag=True)
def embedded_status(as_json: bool) -> None:
    from leaseq.dev.embedded import EmbeddedServer, default_data_dir

    info = EmbeddedServer(default_data_dir()).status()
    if as_json:
        _emit_json({k: str(v) if v is not None else None for k, v in info.__dict__.items()})
        return
    state = "running" if info.running else "stopped"
    click.echo(f"embedded PostgreSQL: {state}")
    click.echo(f"data directory:      {info.data_dir}")
    if info.running:
        click.echo(f"pid:                 {info.pid}")
        click.echo(f"dsn:                 {info.dsn}")


@embedded.command("stop")
def embedded_stop() -> None:
    from leaseq.dev.embedded import EmbeddedServer, default_data_dir

    stopped = EmbeddedServer(default_data_dir()).stop()
    click.echo("stopped" if stopped else "was not running")


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def main(argv: Sequence[str] | None = None) -> NoReturn:
    """Entry point: run the command, turning every expected error into one line."""
    fail = _fail
    try:
        result = cli.main(args=list(argv) if argv is not None else None, standalone_mode=False)
    except click.exceptions.Abort:
        fail("interrupted", 130)
    except click.ClickException as exc:
        fail(exc.format_message(), exc.exit_code)
    except ConfigError as exc:
        fail(str(exc), EXIT_USAGE)
    except LeaseqError as exc:
        fail(str(exc), EXIT_FAILED)
    except psycopg.Error as exc:
        fail(f"database error: {_one_line(exc)}", EXIT_FAILED)
    except KeyboardInterrupt:
        fail("interrupted", 130)
    # click returns the exit code of --help/--version (0) instead of exiting.
    sys.exit(result if isinstance(result, int) else 0)


def _fail(message: str, code: int) -> NoReturn:
    click.echo(f"leaseq: error: {message}", err=True)
    sys.exit(code)
