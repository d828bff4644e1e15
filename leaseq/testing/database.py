"""Test databases: one migrated template per server, schema and leaseq version, cloned
(``CREATE DATABASE ... TEMPLATE``) into a fresh database for every test and dropped after.

The template holds leaseq's schema and the test clock (``leaseq.testing.clock``). It is
built once, under an advisory lock so that parallel test sessions do not race, and named
after a hash of everything it contains, so a changed migration gets a new template.
"""

from __future__ import annotations

import hashlib
import uuid

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from leaseq.client import Client
from leaseq.sql import check_schema_name, migrations
from leaseq.testing import clock

_LOCK_KEY = "leaseq.testing.template"


def template_name(schema: str) -> str:
    digest = hashlib.sha256(schema.encode())
    for migration in migrations(schema):
        digest.update(migration.sql.encode())
    digest.update(clock.INSTALL_SQL.encode())
    return f"leaseq_tpl_{digest.hexdigest()[:16]}"


def database_dsn(server_dsn: str, name: str) -> str:
    """The DSN of database ``name`` on the server, with the test clock in its search_path."""
    return clock.with_clock(make_conninfo(server_dsn, dbname=name))


def ensure_template(server_dsn: str, schema: str = "leaseq") -> str:
    """Create the migrated template for ``schema`` unless it exists; returns its name."""
    schema = check_schema_name(schema)
    name = template_name(schema)
    with psycopg.connect(server_dsn, autocommit=True) as admin:
        admin.execute("SELECT pg_advisory_lock(hashtext(%s))", (_LOCK_KEY,))
        try:
            row = admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,))
            if row.fetchone() is None:
                _build(admin, server_dsn, name, schema)
        finally:
            admin.execute("SELECT pg_advisory_unlock(hashtext(%s))", (_LOCK_KEY,))
    return name


def _build(admin: psycopg.Connection[object], server_dsn: str, name: str, schema: str) -> None:
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
    """Drop a test database, disconnecting whoever is still connected to it."""
    with psycopg.connect(server_dsn, autocommit=True) as admin:
        admin.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )
