"""The Django side of the wiring: settings, the psycopg connection of a database alias
(joining ``atomic()``), and the leaseq App that workers and the admin use."""

from __future__ import annotations

import importlib
from typing import Any

import psycopg
from django.conf import settings
from django.db import connections
from psycopg.conninfo import make_conninfo

from leaseq.app import App
from leaseq.contrib.django.runtime import DISPATCH_TASK, run_django_task
from leaseq.errors import ConfigError

#: The keys of the ``LEASEQ`` setting.
SETTING_KEYS = ("DATABASE", "SCHEMA", "DSN", "APP")


def options() -> dict[str, Any]:
    """The ``LEASEQ`` setting with its defaults filled in."""
    given = dict(getattr(settings, "LEASEQ", {}) or {})
    unknown = set(given) - set(SETTING_KEYS)
    if unknown:
        raise ConfigError(f"unknown LEASEQ setting(s): {', '.join(sorted(unknown))}")
    return {"DATABASE": "default", "SCHEMA": "leaseq", "DSN": None, "APP": None, **given}


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


def _import_app(ref: str) -> App:
    """``LEASEQ["APP"]``: ``"module:attribute"`` or ``"module.attribute"``."""
    module_name, sep, attr = ref.partition(":")
    if not sep:
        module_name, _, attr = ref.rpartition(".")
    try:
        found = getattr(importlib.import_module(module_name), attr, None) if module_name else None
    except ImportError as exc:
        raise ConfigError(f'LEASEQ["APP"]: cannot import {module_name!r}: {exc}') from None
    if not isinstance(found, App):
        raise ConfigError(f'LEASEQ["APP"] = {ref!r} is not a leaseq.App')
    return found


#: The App once made: (app, whether its DSN follows Django's database settings).
_made: list[tuple[App, bool]] = []


def leaseq_app() -> App:
    """The App of the project: ``LEASEQ["APP"]`` (your own App, its plain leaseq tasks
    included) or a new one, with the task that runs ``django.tasks`` tasks
    (``leaseq.contrib.django.run``) registered on it. Without a DSN of its own (``App()``,
    no ``LEASEQ["DSN"]``) it connects with the DATABASE alias's current parameters, read
    at every call: when Django's test runner switches to the test database, the App's
    clients follow."""
    opts = options()
    if not _made:
        given = dict(getattr(settings, "LEASEQ", {}) or {})
        app = _import_app(opts["APP"]) if opts["APP"] else App(schema=opts["SCHEMA"])
        if "SCHEMA" in given:
            app.schema = opts["SCHEMA"]
        if DISPATCH_TASK not in app.tasks:
            app.task(name=DISPATCH_TASK, store_result=True)(run_django_task)
        _made.append((app, app.dsn is None))
    app, follows = _made[0]
    if follows:
        dsn = opts["DSN"] or dsn_for(opts["DATABASE"])
        if app.dsn != dsn:
            app.dsn = dsn  # the setter drops clients of the previous database
    return app


def migrate_after_django(using: str, **_: Any) -> None:
    """``post_migrate``: ``manage.py migrate`` (and so the creation of Django's test
    database) also creates or upgrades leaseq's schema in the DATABASE alias, unless
    leaseq lives elsewhere (``LEASEQ["DSN"]``, or an App with a DSN of its own)."""
    opts = options()
    if using != opts["DATABASE"] or opts["DSN"]:
        return
    app = leaseq_app()
    if not _made[0][1]:
        return
    app.client.migrate()
    app.close()  # Django's test runner drops this database at the end: hold no connection
