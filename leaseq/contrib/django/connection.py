"""The Django side of the wiring: settings, the psycopg connection of a database alias
(joining ``atomic()``), and the leaseq App that workers and the admin use."""

from __future__ import annotations

import functools
from typing import Any

import psycopg
from django.conf import settings
from django.db import connections
from psycopg.conninfo import make_conninfo

from leaseq.app import App
from leaseq.contrib.django.runtime import DISPATCH_TASK, run_django_task
from leaseq.errors import ConfigError


def options() -> dict[str, Any]:
    """The ``LEASEQ`` setting with its defaults filled in."""
    given = dict(getattr(settings, "LEASEQ", {}) or {})
    unknown = set(given) - {"DATABASE", "SCHEMA", "DSN"}
    if unknown:
        raise ConfigError(f"unknown LEASEQ setting(s): {', '.join(sorted(unknown))}")
    return {"DATABASE": "default", "SCHEMA": "leaseq", "DSN": None, **given}


def connection_for(alias: str | None = None) -> psycopg.Connection[Any]:
    """The psycopg connection of database ``alias`` (default: LEASEQ["DATABASE"]), inside
    the current ``atomic()`` block if there is one (autocommit outside any). leaseq never
    commits, rolls back or changes autocommit on it."""
    wrapper = connections[alias or options()["DATABASE"]]
    if wrapper.vendor != "postgresql":
        raise ConfigError(f"database {wrapper.alias!r} is not PostgreSQL")
    wrapper.ensure_connection()
    conn = wrapper.connection
    if not isinstance(conn, psycopg.Connection):
        raise ConfigError(
            f"database {wrapper.alias!r} does not use psycopg 3 (leaseq needs Django >= 4.2 "
            "with psycopg installed)"
        )
    return conn


_LIBPQ_KEYS = frozenset(
    option.keyword.decode() for option in psycopg.pq.Conninfo.get_defaults() if option.keyword
)


def dsn_for(alias: str) -> str:
    """A libpq DSN with the connection parameters Django uses for ``alias``."""
    params = connections[alias].get_connection_params()
    kept = {k: v for k, v in params.items() if k in _LIBPQ_KEYS and isinstance(v, str | int)}
    return make_conninfo(**{k: str(v) for k, v in kept.items()})


@functools.cache
def leaseq_app() -> App:
    """The App of Django's tasks: one task (``leaseq.contrib.django.run``) that runs the
    ``django.tasks`` task named in the job's payload."""
    opts = options()
    app = App(opts["DSN"] or dsn_for(opts["DATABASE"]), schema=opts["SCHEMA"])
    app.task(name=DISPATCH_TASK, store_result=True)(run_django_task)
    return app
