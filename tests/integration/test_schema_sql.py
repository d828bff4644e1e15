"""schema.sql against the migrations: a schema built from ``leaseq/sql/schema.sql`` must be
identical to one built by running every migration from 0001.

The two are compared through the catalog (relations, columns with types, defaults,
nullability and identity, constraints, indexes with their definitions, views, types and enum
labels, functions, triggers, sequences) and the recorded schema versions, with the schema's
own name normalised away. A migration added without the matching change to schema.sql
breaks this test.
"""

from __future__ import annotations

import pathlib
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

import leaseq
from leaseq.sql import _render, latest_version

SCHEMA_SQL = pathlib.Path(leaseq.__file__).parent / "sql" / "schema.sql"

#: name -> query over the catalog for the schema ``%(s)s``, rows in a stable order.
CATALOG: dict[str, str] = {
    "relations": """
        SELECT c.relname, c.relkind, c.relpersistence, c.reloptions,
               (SELECT t.reloptions FROM pg_class t WHERE t.oid = c.reltoastrelid)
        FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = %(s)s ORDER BY 1""",
    "columns": """
        SELECT c.relname, a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull,
               pg_get_expr(d.adbin, d.adrelid), a.attidentity, a.attgenerated
        FROM pg_attribute a
        JOIN pg_class c ON c.oid = a.attrelid
        JOIN pg_namespace n ON n.oid = c.relnamespace
        LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
        WHERE n.nspname = %(s)s AND a.attnum > 0 AND NOT a.attisdropped
        ORDER BY c.relname, a.attnum""",
    "constraints": """
        SELECT c.relname, k.conname, k.contype, pg_get_constraintdef(k.oid)
        FROM pg_constraint k
        JOIN pg_class c ON c.oid = k.conrelid
        JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = %(s)s ORDER BY 1, 2""",
    "indexes": """
        SELECT tablename, indexname, indexdef FROM pg_indexes
        WHERE schemaname = %(s)s ORDER BY 1, 2""",
    "views": """
        SELECT viewname, definition FROM pg_views WHERE schemaname = %(s)s ORDER BY 1""",
    "types": """
        SELECT t.typname, t.typtype,
               array(SELECT e.enumlabel FROM pg_enum e
                     WHERE e.enumtypid = t.oid ORDER BY e.enumsortorder)
        FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace
        WHERE n.nspname = %(s)s ORDER BY 1""",
    "functions": """
        SELECT p.proname, p.prokind, pg_get_function_identity_arguments(p.oid),
               CASE WHEN p.prokind IN ('f', 'p') THEN pg_get_functiondef(p.oid) END
        FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
        WHERE n.nspname = %(s)s ORDER BY 1, 3""",
    "triggers": """
        SELECT c.relname, t.tgname, pg_get_triggerdef(t.oid)
        FROM pg_trigger t
        JOIN pg_class c ON c.oid = t.tgrelid
        JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = %(s)s AND NOT t.tgisinternal ORDER BY 1, 2""",
    "sequences": """
        SELECT sequencename, data_type::text, start_value, min_value, max_value,
               increment_by, cycle
        FROM pg_sequences WHERE schemaname = %(s)s ORDER BY 1""",
}


def describe(dsn: str, schema: str) -> dict[str, list[tuple[Any, ...]]]:
    """The schema's catalog description, with its own name replaced by ``{schema}``."""

    def norm(value: Any) -> Any:
        if isinstance(value, str):
            return value.replace(f'"{schema}".', "{schema}.").replace(f"{schema}.", "{schema}.")
        if isinstance(value, list):
            return [norm(v) for v in value]
        return value

    found: dict[str, list[tuple[Any, ...]]] = {}
    with psycopg.connect(dsn, autocommit=True) as conn:
        for name, query in CATALOG.items():
            rows = conn.execute(query, {"s": schema}).fetchall()
            found[name] = [tuple(norm(v) for v in row) for row in rows]
        found["schema_version"] = conn.execute(
            sql.SQL("SELECT version, name FROM {}.schema_version ORDER BY version").format(
                sql.Identifier(schema)
            )
        ).fetchall()
    return found


def build_from_schema_sql(dsn: str, schema: str, extra: str = "") -> None:
    text = SCHEMA_SQL.read_text("utf-8")
    with psycopg.connect(dsn) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
        conn.execute(_render(text + extra, schema).encode())


@pytest.fixture()
def other_schema(dsn: str) -> Iterator[str]:
    name = f"t_{uuid.uuid4().hex[:12]}"
    yield name
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


def differences(
    left: dict[str, list[tuple[Any, ...]]], right: dict[str, list[tuple[Any, ...]]]
) -> dict[str, tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]]:
    """Per catalog part, the rows only the left has and the rows only the right has."""
    out = {}
    for part in left.keys() | right.keys():
        a, b = left.get(part, []), right.get(part, [])
        if a != b:
            out[part] = ([r for r in a if r not in b], [r for r in b if r not in a])
    return out


def test_schema_sql_equals_the_migrations_applied_from_0001(
    dsn: str, schema: str, client: leaseq.Client, other_schema: str
) -> None:
    build_from_schema_sql(dsn, other_schema)
    migrated, written = describe(dsn, schema), describe(dsn, other_schema)
    assert migrated["columns"], "the migrated schema has no columns: nothing was compared"
    assert not differences(migrated, written), (
        "leaseq/sql/schema.sql differs from the migrations (only in migrations, only in "
        f"schema.sql): {differences(migrated, written)}"
    )


def test_schema_sql_names_the_latest_migration_version() -> None:
    assert f"-- schema version: {latest_version()}\n" in SCHEMA_SQL.read_text("utf-8")


def test_a_migration_missing_from_schema_sql_is_caught(
    dsn: str, schema: str, client: leaseq.Client, other_schema: str
) -> None:
    """The comparison itself: one more index, or a constraint changed, in only one of the
    two schemas shows up as a difference."""
    build_from_schema_sql(
        dsn,
        other_schema,
        "\nCREATE INDEX jobs_extra_idx ON {schema}.jobs (task);"
        "\nALTER TABLE {schema}.jobs ALTER COLUMN max_attempts SET DEFAULT 9;",
    )
    diff = differences(describe(dsn, schema), describe(dsn, other_schema))
    assert set(diff) >= {"relations", "indexes", "columns"}
