"""The test clock: moves the time leaseq's statements see, without touching their SQL.

leaseq's statements call ``now()`` unqualified. PostgreSQL searches ``pg_catalog`` first
only when ``search_path`` does not name it; a connection whose ``search_path`` is
``leaseq_testclock, pg_catalog, public`` finds this module's ``now()`` (and
``clock_timestamp()``) first, which return the real clock plus a stored shift, or a frozen
instant. Only connections opened with :data:`CLOCK_OPTIONS` (the testing kit's DSNs carry
them) see the test clock.

Limits: column defaults (``created_at``), views (their functions are bound when the view
is created, e.g. the queue statistics view), and connections opened without the options
keep the real clock; Python-side times (``run_at=datetime.now(...)``, a worker's local
lease deadlines) are not moved either.

The SQL below is test-only, so it lives here rather than in ``leaseq/sql/queries/``.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

SCHEMA = "leaseq_testclock"
#: libpq ``options`` that put the test clock first for a connection's statements.
CLOCK_OPTIONS = f"-c search_path={SCHEMA},pg_catalog,public"

INSTALL_SQL = f"""
CREATE SCHEMA IF NOT EXISTS {SCHEMA};
CREATE TABLE IF NOT EXISTS {SCHEMA}.settings (
  one boolean PRIMARY KEY DEFAULT true CHECK (one),
  shift interval NOT NULL DEFAULT interval '0',
  frozen_at timestamptz
);
INSERT INTO {SCHEMA}.settings DEFAULT VALUES ON CONFLICT DO NOTHING;
CREATE OR REPLACE FUNCTION {SCHEMA}.now() RETURNS timestamptz
LANGUAGE sql STABLE PARALLEL SAFE AS
$$ SELECT coalesce(s.frozen_at, pg_catalog.now() + s.shift) FROM {SCHEMA}.settings s $$;
CREATE OR REPLACE FUNCTION {SCHEMA}.clock_timestamp() RETURNS timestamptz
LANGUAGE sql VOLATILE PARALLEL SAFE AS
$$ SELECT coalesce(s.frozen_at, pg_catalog.clock_timestamp() + s.shift)
   FROM {SCHEMA}.settings s $$;
"""

_NOW = f"SELECT {SCHEMA}.now()"
_ADVANCE = f"""
UPDATE {SCHEMA}.settings
SET shift = shift + make_interval(secs => %(seconds)s),
    frozen_at = frozen_at + make_interval(secs => %(seconds)s)
"""
# Freezing at the current test time by default; unfreezing lets time run on from there.
_FREEZE = f"""
UPDATE {SCHEMA}.settings
SET frozen_at = coalesce(%(at)s::timestamptz, {SCHEMA}.now())
"""
_UNFREEZE = f"""
UPDATE {SCHEMA}.settings
SET shift = coalesce(frozen_at - pg_catalog.now(), shift), frozen_at = NULL
"""
_RESET = f"UPDATE {SCHEMA}.settings SET shift = interval '0', frozen_at = NULL"

Connection = psycopg.Connection[Any]


def with_clock(dsn: str) -> str:
    """``dsn`` with :data:`CLOCK_OPTIONS` added to its libpq ``options``."""
    existing = conninfo_to_dict(dsn).get("options") or ""
    if CLOCK_OPTIONS in str(existing):
        return dsn
    return make_conninfo(dsn, options=f"{existing} {CLOCK_OPTIONS}".strip())


def install(conn: Connection) -> None:
    """Create the clock's schema, table and functions in ``conn``'s database (idempotent)."""
    conn.execute(INSTALL_SQL.encode())


def now(conn: Connection) -> dt.datetime:
    """The time leaseq's statements see in this database."""
    row = conn.execute(_NOW).fetchone()
    assert row is not None
    value: dt.datetime = row[0]
    return value


def advance(conn: Connection, seconds: float) -> None:
    """Move the clock forward (or back, with a negative number) by ``seconds``."""
    conn.execute(_ADVANCE, {"seconds": float(seconds)})


def freeze(conn: Connection, at: dt.datetime | None = None) -> None:
    """Stop the clock at ``at`` (default: the current test time); ``advance`` still moves it."""
    conn.execute(_FREEZE, {"at": at})


def unfreeze(conn: Connection) -> None:
    """Let a frozen clock run again, from where it stood."""
    conn.execute(_UNFREEZE)


def reset(conn: Connection) -> None:
    """Back to the real clock."""
    conn.execute(_RESET)


class Clock:
    """The test clock of one database, each call on a short autocommit connection of its
    own (so it works while a test holds a transaction open elsewhere)."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn

    def _connect(self) -> Connection:
        return psycopg.connect(self.dsn, autocommit=True)

    def now(self) -> dt.datetime:
        with self._connect() as conn:
            return now(conn)

    def advance(self, seconds: float) -> None:
        with self._connect() as conn:
            advance(conn, seconds)

    def freeze(self, at: dt.datetime | None = None) -> None:
        with self._connect() as conn:
            freeze(conn, at)

    def unfreeze(self) -> None:
        with self._connect() as conn:
            unfreeze(conn)

    def reset(self) -> None:
        with self._connect() as conn:
            reset(conn)
