"""The commands about jobs: enqueue, jobs, dead (list, purge), replay, cancel and keys
(blocked ordering keys, skip a dead head). Each is a thin layer over the public client API."""

from __future__ import annotations

import datetime as dt
import json
import pathlib
import sys
from typing import Any

import click

from leaseq.cli.durable import durable_fields, durable_lines, jobs_restart, jobs_signal
from leaseq.cli.render import age, emit_json, table
from leaseq.cli.settings import DURATION, Failed, Settings, actor_option, pass_settings
from leaseq.cli.unique import clean, conflict_line, holder_line, unique_options, unique_outcome
from leaseq.cli.workflows import workflow_fields, workflow_lines
from leaseq.codec import shown
from leaseq.errors import ConfigError
from leaseq.jobspec import DEFAULTS
from leaseq.models import Job


def read_payload(text: str | None) -> Any:
    """The JSON payload from the argument itself, ``-`` (stdin) or ``@PATH``.

    Anything that cannot become a JSON document (bad syntax, nesting too deep for the
    parser, a number too long to convert, text that is not valid Unicode, NaN) is a
    one-line usage error, never a traceback.
    """
    if text is None:
        return None
    source = ""
    try:
        if text == "-":
            source = " on stdin"
            text = sys.stdin.buffer.read().decode("utf-8")
        elif text.startswith("@"):
            source = f" in {text[1:]}"
            text = pathlib.Path(text[1:]).read_bytes().decode("utf-8")
    except OSError as exc:
        raise click.BadParameter(f"cannot read {text[1:]}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise click.BadParameter(f"the payload{source} is not UTF-8 text") from None
    try:
        value = json.loads(text)
        # What the database will be sent: catches lone surrogates and NaN/Infinity here.
        json.dumps(value, ensure_ascii=False, allow_nan=False).encode("utf-8")
    except json.JSONDecodeError as exc:
        raise click.BadParameter(
            f"not valid JSON{source} ({exc.msg} at line {exc.lineno} column {exc.colno})"
        ) from None
    except RecursionError:
        raise click.BadParameter(f"the JSON payload{source} is nested too deeply") from None
    except UnicodeError:
        raise click.BadParameter(
            f"the JSON payload{source} holds text that is not valid Unicode (a lone surrogate)"
        ) from None
    except ValueError as exc:  # too many digits in a number; NaN or Infinity
        reason = "a number has too many digits" if "digits" in str(exc) else "NaN or Infinity"
        raise click.BadParameter(f"the JSON payload{source} is not storable: {reason}") from None
    return value


@click.command()
@click.argument("task")
@click.argument("payload", required=False)
@click.option("--queue", "-q", default=DEFAULTS["queue"], show_default=True)
@click.option("--priority", type=int, default=DEFAULTS["priority"], show_default=True)
@click.option("--delay", type=float, default=None, help="Seconds from now (database clock).")
@click.option("--max-attempts", type=int, default=DEFAULTS["max_attempts"], show_default=True)
@click.option("--ordering-key", default=None, help="Run after earlier jobs of this key.")
@click.option("--limit-key", default=None, help="Also under the limit key:KEY (or its family).")
@click.option(
    "--expires", type=float, default=None, help="Start deadline: seconds from now (database clock)."
)
@click.option(
    "--cost",
    type=int,
    default=DEFAULTS["cost"],
    show_default=True,
    help="Units (slots) it takes of every concurrency limit that applies.",
)
@unique_options
@click.option("--json", "as_json", is_flag=True, help="Print {'id': ...} as JSON.")
@pass_settings
def enqueue(
    settings: Settings,
    /,
    task: str,
    payload: str | None,
    queue: str,
    priority: int,
    delay: float | None,
    max_attempts: int,
    ordering_key: str | None,
    limit_key: str | None,
    expires: float | None,
    cost: int,
    as_json: bool,
    **unique: Any,
) -> None:
    """Enqueue TASK with an optional JSON PAYLOAD; prints the job id.

    PAYLOAD is JSON text, `-` to read it from stdin, or @PATH to read it from a file.
    With --unique-key, a key already held prints the holder's id (and says so on stderr).
    """
    result = settings.client.enqueue(
        task,
        read_payload(payload),
        queue=queue,
        priority=priority,
        delay=delay,
        max_attempts=max_attempts,
        ordering_key=ordering_key,
        limit_key=limit_key,
        expires=expires,
        cost=cost,
        **clean(unique),
    )
    if as_json:
        emit_json({"id": int(result), **unique_outcome(result)})
    else:
        click.echo(int(result))
        if result.outcome is not None:
            click.echo(conflict_line(result), err=True)


@click.group()
def jobs() -> None:
    """Inspect single jobs."""


jobs.add_command(jobs_signal)
jobs.add_command(jobs_restart)


def _job_lines(job: Job) -> list[str]:
    fields = job.as_dict()
    payload = json.dumps(shown(fields.pop("payload")), default=str)
    lines = [
        f"{k:20} {'-' if v is None else v}" for k, v in fields.items() if k != "last_error_detail"
    ]
    lines.append(f"{'payload':20} {payload if len(payload) <= 500 else payload[:497] + '...'}")
    if job.last_error_detail:
        lines.append("last_error_detail:")
        lines.extend("  " + line for line in job.last_error_detail.splitlines())
    return lines


JOB_STATES = ("pending", "running", "succeeded", "dead", "cancelled")


@jobs.command("list")
@click.option("--state", type=click.Choice(JOB_STATES), default="pending", show_default=True)
@click.option("--queue", "-q", default=None, help="Only this queue.")
@click.option("--task", default=None, help="Only this task.")
@click.option("--limit", type=int, default=100, show_default=True)
@click.option("--json", "as_json", is_flag=True)
@pass_settings
def jobs_list(
    settings: Settings, state: str, queue: str | None, task: str | None, limit: int, as_json: bool
) -> None:
    """List jobs in one state, newest first, by queue and task."""
    found = settings.reader.list_jobs(state, limit=limit, queue=queue, task=task)
    if as_json:
        emit_json([j.as_dict() for j in found])
        return
    if not found:
        click.echo(f"no {state} jobs")
        return
    rows = [
        [
            j.job_id,
            j.queue,
            j.task,
            f"{j.attempt_count}/{j.max_attempts}",
            j.available_at.isoformat(timespec="seconds"),
            j.last_error_code or "-",
        ]
        for j in found
    ]
    click.echo(table(["id", "queue", "task", "attempts", "runnable at", "last error"], rows))


@jobs.command("run-now")
@click.argument("job_id", type=int)
@click.option("--reason", default=None)
@actor_option("runs it now")
@pass_settings
def jobs_run_now(settings: Settings, job_id: int, reason: str | None, actor: str) -> None:
    """Make a scheduled pending job (a retry waiting out its back-off) due now."""
    if settings.client.run_now(job_id, actor=actor, reason=reason):
        click.echo(f"job {job_id}: due now")
        return
    job = settings.client.get_job(job_id)
    if job is None:
        raise Failed(f"no job with id {job_id}")
    if job.status == "pending":
        raise Failed(f"job {job_id} is due already; nothing to do")
    raise Failed(f"job {job_id} is {job.status}, not a scheduled pending job")


@jobs.command("show")
@click.argument("job_id", type=int)
@click.option("--json", "as_json", is_flag=True)
@pass_settings
def jobs_show(settings: Settings, job_id: int, as_json: bool) -> None:
    """A job's row and its full history of transitions."""
    reader = settings.reader
    job = reader.get_job(job_id)
    if job is None:
        raise Failed(f"no job with id {job_id}")
    events = reader.job_events(job_id)
    effects = reader.job_effects(job_id)
    holder = reader.unique_key_holder(job_id)
    flow = workflow_fields(reader, job_id)
    durable = durable_fields(reader, job_id)
    if as_json:
        emit_json(
            {
                "job": job.as_dict(),
                "unique_key_holder": holder.as_dict() if holder else None,
                **flow,
                "events": [e.as_dict() for e in events],
                "effects": [f.as_dict() for f in effects],
                **durable,
            }
        )
        return
    click.echo("\n".join(_job_lines(job)))
    if holder is not None:
        click.echo(holder_line(job_id, holder))
    for line in workflow_lines(flow):
        click.echo(line)
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
        click.echo(table(headers, rows))
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
        click.echo(table(["effect", "status", "attempt", "token", "started", "error"], effect_rows))
    for line in durable_lines(durable):
        click.echo(line)


@click.group()
def dead() -> None:
    """Dead jobs: kept, inspectable, replayable."""


def job_filters(func: Any) -> Any:
    """The operator filter: queue, task, error code, age since the job finished.

    Command line only: a filter never comes from the environment."""
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
    found = settings.reader.list_jobs("dead", limit=limit, **filters)
    if as_json:
        emit_json([j.as_dict() for j in found])
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
            age((now - j.finished_at).total_seconds()) if j.finished_at else "-",
        ]
        for j in found
    ]
    click.echo(table(["id", "queue", "task", "error", "class", "attempts", "dead for"], rows))
    total = settings.reader.count_jobs("dead", **filters)
    if total > len(found):
        click.echo(f"({len(found)} of {total} shown; use --limit)")


@dead.command("purge")
@job_filters
@click.option("--reason", required=True, help="Why they are removed; kept in the audit trail.")
@actor_option("purges")
@click.option("--dry-run", is_flag=True, help="Only count what would be purged.")
@pass_settings
def dead_purge(
    settings: Settings, /, reason: str, actor: str, dry_run: bool, **filters: Any
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
    with click.progressbar(length=count, label="purging", file=sys.stderr) as bar:
        done = settings.client.purge_dead(
            reason=reason, actor=actor, on_progress=bar.update, **filters
        )
    click.echo(f"purged {done} dead job(s)")


@click.command()
@click.argument("job_id", type=int, required=False)
@click.option("--reason", required=True, help="What was fixed; stored in the audit trail.")
@actor_option("replays")
@click.option("--allow-cancelled", is_flag=True, help="Also replay cancelled jobs.")
@click.option(
    "--with-dependents",
    is_flag=True,
    help="Also replay the jobs cancelled because these ended (DEPENDENCY_FAILED).",
)
@job_filters
@click.option("--all", "everything", is_flag=True, help="Bulk: every dead job (no filter).")
@click.option("--dry-run", is_flag=True, help="Bulk: only count what would be replayed.")
@pass_settings
def replay(
    settings: Settings,
    /,
    job_id: int | None,
    reason: str,
    actor: str,
    allow_cancelled: bool,
    with_dependents: bool,
    everything: bool,
    dry_run: bool,
    **filters: Any,
) -> None:
    """Bring dead jobs back to pending under the same ids (audited).

    One job: `replay ID --reason ...`. Many: `replay --error-code TIMEOUT --reason ...`
    (any of the filters, or --all), with --dry-run to count first.
    """
    client = settings.client
    has_filter = any(v is not None for v in filters.values())
    if job_id is not None:
        if has_filter or everything or dry_run:
            raise ConfigError("give a job id or bulk filters, not both")
        if client.replay(
            job_id,
            reason=reason,
            actor=actor,
            allow_cancelled=allow_cancelled,
            with_dependents=with_dependents,
        ):
            click.echo(f"job {job_id} replayed by {actor}")
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
            actor=actor,
            allow_cancelled=allow_cancelled,
            with_dependents=with_dependents,
            on_progress=bar.update,
            **filters,
        )
    click.echo(f"replayed {done} job(s) by {actor}")
    for refused_id, holder_id in done.refused:
        by = f"job {holder_id}" if holder_id is not None else "another job"
        click.echo(f"refused job {refused_id}: its unique key is held by {by}", err=True)


#: The most pending jobs one bulk cancel takes (run it again for more).
BULK_CANCEL_MAX = 100_000


@click.command()
@click.argument("job_id", type=int, required=False)
@click.option("--queue", "-q", default=None, help="Bulk: the pending jobs of this queue.")
@click.option("--task", default=None, help="Bulk: the pending jobs of this task.")
@click.option("--dry-run", is_flag=True, help="Bulk: only count what would be cancelled.")
@click.option("--reason", default=None)
@actor_option("cancels")
@pass_settings
def cancel(
    settings: Settings,
    job_id: int | None,
    queue: str | None,
    task: str | None,
    dry_run: bool,
    reason: str | None,
    actor: str,
) -> None:
    """Cancel a pending job, or ask the worker running it to stop. Without JOB_ID: cancel
    the pending jobs that --queue and/or --task select (--dry-run: count them)."""
    if job_id is None:
        _cancel_pending(settings, queue, task, dry_run, reason, actor)
        return
    if queue or task or dry_run:
        raise ConfigError("give a JOB_ID or the bulk filters (--queue/--task), not both")
    if settings.client.cancel(job_id, actor=actor, reason=reason):
        job = settings.client.get_job(job_id)
        state = "cancelled" if job and job.status == "cancelled" else "cancel requested"
        click.echo(f"job {job_id}: {state}")
        return
    job = settings.client.get_job(job_id)
    if job is None:
        raise Failed(f"no job with id {job_id}")
    raise Failed(f"job {job_id} is already {job.status}; nothing to cancel")


@click.group()
def keys() -> None:
    """Ordering keys (blocked by a dead head, skip one) and encryption keys (generate, rotate)."""


@keys.command("blocked")
@click.option("--limit", type=int, default=100, show_default=True)
@click.option("--json", "as_json", is_flag=True)
@pass_settings
def keys_blocked(settings: Settings, limit: int, as_json: bool) -> None:
    """Keys whose head job is dead (policy block): later jobs of the key wait for it."""
    found = settings.reader.blocked_keys(limit=limit)
    if as_json:
        emit_json([k.as_dict() for k in found])
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
            age((now - k.dead_since).total_seconds()) if k.dead_since else "-",
            k.waiting,
        ]
        for k in found
    ]
    click.echo(table(["key", "dead head", "task", "error", "dead for", "waiting"], rows))
    click.echo("replay the head (leaseq replay ID) or skip it (leaseq keys skip ID --reason ...)")


@keys.command("skip")
@click.argument("job_id", type=int)
@click.option("--reason", required=True, help="Why the key may move on; kept in the trail.")
@actor_option("skips")
@pass_settings
def keys_skip(settings: Settings, job_id: int, reason: str, actor: str) -> None:
    """Let a key move past its dead head JOB_ID (the head stays dead, replayable)."""
    if settings.client.skip_dead_head(job_id, reason=reason, actor=actor):
        click.echo(f"job {job_id} skipped by {actor}; its key moves on")
        return
    job = settings.client.get_job(job_id)
    if job is None:
        raise Failed(f"no job with id {job_id}")
    raise Failed(f"job {job_id} is not a dead head of an ordering key (it is {job.status})")


COMMANDS: tuple[click.Command, ...] = (enqueue, jobs, dead, replay, cancel, keys)


def _cancel_pending(
    settings: Settings,
    queue: str | None,
    task: str | None,
    dry_run: bool,
    reason: str | None,
    actor: str,
) -> None:
    """Each matching pending job goes through the single-job cancel (its own transaction,
    keys, dependents and batch as ``cancel JOB_ID``); a job claimed after it was listed
    gets a cancel request instead, as ``cancel JOB_ID`` would give it."""
    if queue is None and task is None:
        raise ConfigError("cancel needs a JOB_ID, or --queue and/or --task to select jobs")
    found = settings.client.list_jobs("pending", limit=BULK_CANCEL_MAX, queue=queue, task=task)
    if dry_run:
        click.echo(f"would cancel {len(found)} pending job(s)")
        return
    done = sum(settings.client.cancel(j.job_id, actor=actor, reason=reason) for j in found)
    click.echo(f"cancelled {done} pending job(s)")
