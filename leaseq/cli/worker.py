"""``leaseq worker``: run (or supervise) worker processes for an app's tasks.

Its options are built from the fields of :class:`~leaseq.worker.WorkerConfig`: the name,
type and default come from the dataclass, the help text from each field's metadata. Each
option can also be set as ``LEASEQ_WORKER_<OPTION>`` (e.g. ``LEASEQ_WORKER_CONCURRENCY``).
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import logging
import os
import sys
import time
import typing
from collections.abc import Callable
from typing import Any

import click
from prometheus_client import disable_created_metrics

from leaseq import validate
from leaseq.app import App
from leaseq.cli.settings import DURATION, DURATION_OR_NEVER, Settings, pass_settings
from leaseq.errors import ConfigError
from leaseq.rules.routing import QueueMap
from leaseq.worker import QueueSettings, WorkerConfig, run_worker
from leaseq.worker.databases import run_workers
from leaseq.worker.runner import exit_code
from leaseq.worker.supervisor import Supervisor

ENV_PREFIX = "LEASEQ_WORKER_"

start_log = logging.getLogger("leaseq.start")


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
    if not hasattr(module, attr):
        raise ConfigError(f"{ref}: module {module_name!r} has no attribute {attr!r}")
    app = getattr(module, attr)
    if not isinstance(app, App):
        raise ConfigError(f"{ref} is not a leaseq.App (found {type(app).__name__})")
    return app


def refuse_unknown_env(command: click.Command, environ: typing.Mapping[str, str]) -> None:
    """A ``LEASEQ_WORKER_*`` variable that names no option is refused with one line: set
    by mistake (a typo, a singular for a plural), it would otherwise be ignored silently."""
    known: set[str] = set()
    for param in command.params:
        names = param.envvar if isinstance(param.envvar, list | tuple) else [param.envvar]
        known.update(n for n in names if isinstance(n, str))
    unknown = sorted(n for n in environ if n.startswith(ENV_PREFIX) and n not in known)
    if unknown:
        close = difflib.get_close_matches(unknown[0], sorted(known), n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise ConfigError(
            f"{unknown[0]} is not a worker setting{hint}; see `leaseq worker --help` for the "
            "LEASEQ_WORKER_<OPTION> variables"
        )


def bind_app(app: App, settings: Settings, queue_dsns: tuple[str, ...] = ()) -> None:
    """Apply the global options to the app: a given DSN or schema beats the app's own, and
    each ``--queue-dsn QUEUE=DSN`` beats the app's own database for that queue."""
    app.prepare = app.prepare and settings.prepare
    if settings.dsn:
        app.dsn = settings.dsn
    if settings.schema_given:
        app.schema = settings.schema
    app.queue_dsns.update(QueueMap.parse(queue_dsns).routes)


def child_argv(argv: list[str]) -> list[str]:
    """The command line of one supervised child: the parent's, forced to one process.

    Appended last, ``--processes 1`` wins over any earlier spelling (``-p2``, ``-cp 2``,
    ``--processes=2``) and over ``LEASEQ_WORKER_PROCESSES``, which the children inherit.
    """
    return [*argv, "--processes", "1"]


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


def left_behind(paused: int, held: int) -> str:
    """The burst exit line's tail: due jobs it could not run, and why."""
    parts = []
    if paused:
        parts.append(f"{paused} job(s) left pending behind a pause (`leaseq pauses`)")
    if held:
        parts.append(f"{held} job(s) left pending behind a limit or ordering key")
    return "; " + "; ".join(parts) if parts else ""


def _shown(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


def _option(spec: dataclasses.Field[Any], hint: Any) -> Callable[[Any], Any]:
    """The click option of one WorkerConfig field."""
    meta = spec.metadata
    kind = meta["kind"]
    default = None if spec.default is dataclasses.MISSING else spec.default
    base = next((a for a in typing.get_args(hint) if a is not type(None)), hint)
    name = spec.name.replace("_", "-")
    if kind == "negated_flag":
        flags = [f"--no-{name}"]
        extra: dict[str, Any] = {"is_flag": True}
        dest = f"no_{spec.name}"
    elif base is bool:
        flags, extra, dest = [f"--{name}"], {"is_flag": True}, spec.name
    else:
        shown: Any = True
        if kind == "duration":
            param_type: Any = DURATION
            shown = default is not None and _shown(default)
        elif kind == "duration_or_never":
            param_type = DURATION_OR_NEVER
            shown = "never" if default is None else _shown(default)
        else:
            param_type = {int: click.INT, float: click.FLOAT, str: click.STRING}[base]
        flags = [f"--{name}"]
        extra = {"type": param_type, "default": default, "show_default": shown}
        dest = spec.name
    if meta["short"]:
        flags.append(meta["short"])
    return click.option(
        *flags,
        dest,
        help=meta["help"],
        envvar=ENV_PREFIX + dest.upper(),
        show_envvar=True,
        **extra,
    )


def _config_fields() -> list[tuple[dataclasses.Field[Any], Any]]:
    hints = typing.get_type_hints(WorkerConfig)
    return [(f, hints[f.name]) for f in dataclasses.fields(WorkerConfig) if f.metadata["option"]]


def config_options(func: Any) -> Any:
    """Decorate ``func`` with one option per WorkerConfig field."""
    for spec, hint in reversed(_config_fields()):
        func = _option(spec, hint)(func)
    return func


def config_from_options(queues: tuple[QueueSettings, ...], options: dict[str, Any]) -> WorkerConfig:
    """The WorkerConfig the parsed options describe (the inverse of :func:`config_options`)."""
    values: dict[str, Any] = {}
    for spec, _ in _config_fields():
        if spec.metadata["kind"] == "negated_flag":
            values[spec.name] = not options[f"no_{spec.name}"]
        elif options[spec.name] is not None or spec.default is not dataclasses.MISSING:
            values[spec.name] = options[spec.name]  # a factory default (worker_id) stays
    return WorkerConfig(queues=queues, **values)


@click.command()
@click.argument("app_ref", metavar="MODULE:APP")
@click.option(
    "--queue",
    "-q",
    "queues",
    multiple=True,
    # LEASEQ_WORKER_QUEUE is what the LEASEQ_WORKER_<OPTION> rule gives for --queue.
    envvar=[ENV_PREFIX + "QUEUE", ENV_PREFIX + "QUEUES"],
    show_envvar=True,
    help=(
        "Queue to serve, repeatable: NAME[=WEIGHT][:lease=SECONDS,batch=N]; weights split "
        "the slots between queues that all have work. Default: default. In the "
        "environment: space-separated."
    ),
)
@click.option(
    "--any-queue",
    is_flag=True,
    envvar=ENV_PREFIX + "ANY_QUEUE",
    show_envvar=True,
    help="Allow queues no task of the app declares.",
)
@click.option(
    "--queue-dsn",
    "queue_dsns",
    multiple=True,
    metavar="QUEUE=DSN",
    envvar=ENV_PREFIX + "QUEUE_DSN",
    show_envvar=True,
    help=(
        "Queue on another database than --dsn, repeatable (the app's tasks enqueue there "
        "too); the process runs one worker per database. Env: space-separated, URL DSNs."
    ),
)
@click.option(
    "--processes",
    "-p",
    type=int,
    default=1,
    show_default=True,
    envvar=ENV_PREFIX + "PROCESSES",
    show_envvar=True,
    help="Supervise N worker processes.",
)
@config_options
@pass_settings
def worker(
    settings: Settings,
    /,
    app_ref: str,
    queues: tuple[str, ...],
    any_queue: bool,
    queue_dsns: tuple[str, ...],
    processes: int,
    **options: Any,
) -> None:
    """Run a worker for the tasks of MODULE:APP until stopped (SIGTERM/SIGINT).

    Every option can also come from the environment: LEASEQ_WORKER_<OPTION>, e.g.
    LEASEQ_WORKER_CONCURRENCY=20. Exit codes: 0 clean stop, 3 running jobs had to be
    abandoned at shutdown (they are retried), 4 hard stop of a sync handler that did not end
    after its soft stop (--stop-grace), 1 error, 2 bad configuration.

    With --queue-dsn (or the app's App(queues=...)), queues on several databases are served
    by one worker per database in this process, each with these options (docs/scaling.md).
    """
    refuse_unknown_env(click.get_current_context().command, os.environ)
    app = load_app(app_ref)
    bind_app(app, settings, queue_dsns)
    config = config_from_options(_queue_settings(queues, app, any_queue), options)
    validate.check_int("processes", processes, 1, 256)
    if processes > 1 and options["worker_id"]:
        raise ConfigError("--worker-id names one process; it cannot be used with --processes")
    # The process is leaseq's own: the *_created series would only double the scrape.
    disable_created_metrics()  # type: ignore[no-untyped-call]
    # Always shown, in the chosen log format: which database this worker serves (the worker
    # says it once its database answered and the schema fits, so a failed start stays one line).
    start_log.setLevel(logging.INFO)
    if processes > 1:
        command = [sys.executable, "-m", "leaseq", *child_argv(sys.argv[1:])]
        sys.exit(Supervisor(command, processes, restart=not (config.burst or config.drain)).run())
    started = time.monotonic()
    stats = run_workers(app, config) if app.queue_dsns else run_worker(app, config)
    elapsed = time.monotonic() - started
    if config.burst or config.drain:
        done = stats.succeeded + stats.failed
        click.echo(
            f"processed {done} job(s) in {elapsed:.2f}s ({done / elapsed:.0f}/s): "
            f"{stats.succeeded} succeeded, {stats.failed} failed, "
            f"{stats.lost_leases + stats.lost_fence_writes} lost lease(s)"
            + left_behind(stats.left_paused, stats.left_held)
        )
    # Exit without joining handler threads: a sync handler that was abandoned (shutdown
    # timeout, second signal, max_runtime) may still be running, and its result is
    # discarded anyway. Everything the database needed has been written by now.
    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()
    os._exit(exit_code(stats))
