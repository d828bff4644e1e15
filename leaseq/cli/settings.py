"""What every command shares: the global settings, exit codes, parameter types, ``--actor``.

The environment is read only where an option says so (``envvar=``, shown in ``--help``):
``LEASEQ_DSN``, ``LEASEQ_READ_DSN`` and ``LEASEQ_SCHEMA`` for every command, and
``LEASEQ_WORKER_<OPTION>`` for the worker's settings. No other command takes anything from
the environment, so a stray variable can never become, say, a filter of a destructive
command.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import click
from click.core import ParameterSource

from leaseq import validate
from leaseq.client import Client
from leaseq.errors import ConfigError

EXIT_FAILED = 1
EXIT_USAGE = 2


class Failed(click.ClickException):
    """The command was understood but could not be carried out."""

    exit_code = EXIT_FAILED


class Settings:
    """The global options (``--dsn``, ``--read-dsn``, ``--schema``, ``--no-prepare``) and
    the lazy clients: ``client`` for everything that writes (and the reads that must see its
    writes), ``reader`` for the inspection commands (on ``--read-dsn`` when given)."""

    def __init__(
        self,
        dsn: str | None,
        schema: str,
        prepare: bool = True,
        *,
        schema_given: bool = True,
        read_dsn: str | None = None,
    ) -> None:
        self.dsn = dsn
        self.read_dsn = (read_dsn or "").strip() or None
        self.schema = schema
        self.prepare = prepare
        #: ``--schema``/``LEASEQ_SCHEMA`` was given (not just the default), so it beats an
        #: app's own schema even when its value equals the default.
        self.schema_given = schema_given
        self._client: Client | None = None
        self._reader: Client | None = None

    @classmethod
    def from_context(cls, ctx: click.Context) -> Settings:
        """From the parsed global options of the root command's context."""
        source = ctx.get_parameter_source("schema")
        return cls(
            ctx.params["dsn"],
            ctx.params["schema"],
            prepare=not ctx.params["no_prepare"],
            read_dsn=ctx.params.get("read_dsn"),
            schema_given=source is not None and source is not ParameterSource.DEFAULT,
        )

    @property
    def client(self) -> Client:
        if self._client is None:
            self._client = Client(self.dsn, schema=self.schema, pool_size=2, prepare=self.prepare)
        return self._client

    @property
    def reader(self) -> Client:
        """The client of the inspection commands: reads on ``--read-dsn`` when given (the
        primary is still used for the replica's lag and the schema check), else ``client``."""
        if self.read_dsn is None:
            return self.client
        if self._reader is None:
            self._reader = Client(
                self.dsn,
                schema=self.schema,
                pool_size=2,
                prepare=self.prepare,
                read_dsn=self.read_dsn,
            )
        return self._reader

    def close(self) -> None:
        for client in (self._reader, self._client):
            if client is not None:
                client.close()


pass_settings = click.make_pass_decorator(Settings)


if TYPE_CHECKING:
    _FloatParam = click.ParamType[float]
    _OptionalFloatParam = click.ParamType[float | None]
else:  # click < 8.3 has no generic ParamType at run time
    _FloatParam = click.ParamType
    _OptionalFloatParam = click.ParamType


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


class DurationOrNever(_OptionalFloatParam):
    """A duration, or ``never`` (None: no limit)."""

    name = "duration|never"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> float | None:
        if value is None or isinstance(value, int | float):
            return None if value is None else float(value)
        if value.strip().lower() == "never":
            return None
        try:
            return validate.parse_duration(value)
        except ConfigError as exc:
            self.fail(f"{exc}, or 'never'", param, ctx)


DURATION = Duration()
DURATION_OR_NEVER = DurationOrNever()


def _default_actor() -> str:
    return os.environ.get("USER") or "operator"


F = TypeVar("F", bound=Callable[..., Any])


def actor_option(verb: str) -> Callable[[F], F]:
    """``--actor``: who did it, kept in the audit trail (default: $USER, else 'operator')."""
    return click.option(
        "--actor",
        default=_default_actor,
        show_default="$USER",
        help=f"Who {verb}; kept in the audit trail.",
    )
