"""The ``leaseq`` command line, built only on the public API: the global group, and
:func:`main`, which turns every expected error into one line.

Every error a person can cause (bad argument, bad DSN, unknown job) ends as one line on
stderr and a non-zero exit code, never as a traceback:

- 0: done; 1: the operation could not be done (database down, job not in that state);
- 2: bad usage or configuration; 130: interrupted.

The commands live in ``admin`` (migrate, prune, sweep, metrics, embedded), ``jobs``
(enqueue, jobs, dead, replay, cancel, keys), ``status``, ``pauses``, ``schedules``,
``limits``, ``scaling``, ``tokens``, ``workflows`` (batches, waiting jobs), ``worker``,
``demo`` and ``web`` (the dashboard); tables in ``render``; shared settings and parameter
types in ``settings``. None of them imports this module, so the package has no import cycle.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from typing import NoReturn

import click
import psycopg

from leaseq.cli import admin, crypto, jobs, limits, pauses, scaling, tokens, workflows
from leaseq.cli.demo import demo
from leaseq.cli.schedules import schedules
from leaseq.cli.settings import EXIT_FAILED, EXIT_USAGE, Settings
from leaseq.cli.web import web
from leaseq.cli.worker import worker
from leaseq.errors import ConfigError, LeaseqError
from leaseq.logs import configure as configure_logging

__all__ = ["cli", "main"]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--dsn",
    envvar="LEASEQ_DSN",
    show_envvar=True,
    help=(
        "PostgreSQL connection string. Unset: the embedded development server, with a "
        "warning; 'embedded': that server, without one."
    ),
)
@click.option(
    "--read-dsn",
    envvar="LEASEQ_READ_DSN",
    show_envvar=True,
    help=(
        "A read replica (streaming standby) for status, metrics, the dashboard and the "
        "inspection commands; writes always go to --dsn. Unreachable: those reads fail."
    ),
)
@click.option(
    "--schema",
    envvar="LEASEQ_SCHEMA",
    show_envvar=True,
    default="leaseq",
    show_default=True,
    help="Schema holding leaseq's tables; given, it beats a worker app's own schema.",
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
def cli(ctx: click.Context, /, verbose: int, log_format: str, **_: object) -> None:
    """leaseq: a PostgreSQL job queue with fenced, expiring leases."""
    level = {0: logging.WARNING, 1: logging.INFO}.get(verbose, logging.DEBUG)
    configure_logging(level=level, json_format=log_format == "json")
    settings = Settings.from_context(ctx)
    ctx.obj = settings
    ctx.call_on_close(settings.close)


for _key_command in crypto.KEY_COMMANDS:
    jobs.keys.add_command(_key_command)

for _command in (
    *admin.COMMANDS,
    *jobs.COMMANDS,
    *pauses.COMMANDS,
    *limits.COMMANDS,
    *scaling.COMMANDS,
    *tokens.COMMANDS,
    *workflows.COMMANDS,
    schedules,
    worker,
    demo,
    web,
):
    cli.add_command(_command)


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
    except RecursionError:  # input nested past the interpreter's limit, wherever it showed
        fail("input nested too deeply", EXIT_USAGE)
    except KeyboardInterrupt:
        fail("interrupted", 130)
    # click returns the exit code of --help/--version (0) instead of exiting.
    sys.exit(result if isinstance(result, int) else 0)


def _fail(message: str, code: int) -> NoReturn:
    click.echo(f"leaseq: error: {message}", err=True)
    sys.exit(code)
