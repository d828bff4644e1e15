"""Test databases: one migrated template per server, schema and leaseq version, cloned
(``CREATE DATABASE ... TEMPLATE``) into a fresh database for every test and dropped after.

The template holds leaseq's schema and the test clock (``leaseq.testing.clock``). It is
built once, under an advisory lock so that parallel test sessions do not race, named after
a hash of everything it contains (a changed migration gets a new template), and closed to
connections once built, since a connection to it would make clones fail.
"""

from __future__ import annotations

import hashlib
import uuid
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from leaseq.client import Client
from leaseq.sql import check_schema_name, migrations
from leaseq.testing import clock

_LOCK_KEY = "leaseq.testing.template"
#: Part of the template's name: bump when the way templates are built changes.
_BUILD = "2"

Connection = psycopg.Connection[Any]


def template_name(schema: str) -> str:
    digest = hashlib.sha256(f"{_BUILD}:{schema}".encode())
    for migration in migrations(schema):
        digest.update(migration.sql.encode())
    digest.update(clock.INSTALL_SQL.encode())
    return f"leaseq_tpl_{digest.hexdigest()[:16]}"


def database_dsn(server_dsn: str, name: str) -> str:
    """The DSN of database ``name`` on the server, with the test clock in its search_path."""
    return clock.with_clock(make_conninfo(server_dsn, dbname=name))


def _exists(admin: Connection, name: str) -> bool:
    row = admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
    return row is not None


def ensure_template(server_dsn: str, schema: str = "leaseq") -> str:
    """Create the migrated template for ``schema`` unless it exists; returns its name."""
    schema = check_schema_name(schema)
    name = template_name(schema)
    with psycopg.connect(server_dsn, autocommit=True) as admin:
        admin.execute("SELECT pg_advisory_lock(hashtext(%s))", (_LOCK_KEY,))
        try:
            if not _exists(admin, name):
                _build(admin, server_dsn, name, schema)
        finally:
            admin.execute("SELECT pg_advisory_unlock(hashtext(%s))", (_LOCK_KEY,))
    return name


def _build(admin: Connection, server_dsn: str, name: str, schema: str) -> None:
    admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        dsn = database_dsn(server_dsn, name)
        with psycopg.connect(dsn, autocommit=True) as conn:
            clock.install(conn)
        client = Client(dsn, schema=schema, pool_size=1)
        try:
            client.migrate()
        finally:
            client.close()
        admin.execute(
            sql.SQL("ALTER DATABASE {} WITH IS_TEMPLATE true ALLOW_CONNECTIONS false").format(
                sql.Identifier(name)
            )
        )
    except BaseException:
        drop_database(server_dsn, name)
        raise


def clone(server_dsn: str, template: str) -> str:
    """A new database copied from ``template``; returns its name."""
    name = f"leaseq_test_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(server_dsn, autocommit=True) as admin:
        admin.execute(
            sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                sql.Identifier(name), sql.Identifier(template)
            )
        )
    return name


def drop_database(server_dsn: str, name: str) -> None:
    """Drop a test database or a template, disconnecting whoever is still connected."""
    ident = sql.Identifier(name)
    with psycopg.connect(server_dsn, autocommit=True) as admin:
        if _exists(admin, name):
            admin.execute(sql.SQL("ALTER DATABASE {} WITH IS_TEMPLATE false").format(ident))
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(ident))
