"""Small tools the tests share: moving time in the database, reading rows directly."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql


def worker_sessions_gone(dsn: str, schema: str) -> bool:
    """No worker session on this schema is left on the server. After ``kill -9`` the process
    is gone at once, but a statement it had sent (a claim, a lease renewal, a completion)
    still runs to its commit: a test that moves leases before then can see its change
    overwritten (a late claim leaves a fresh 60-second lease behind the test's back)."""
    ((n,),) = rows(
        dsn,
        "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'leaseq-%%' "
        "AND query LIKE %s AND pid <> pg_backend_pid()",
        schema,
        f"%{schema}%",
    )
    return int(n) == 0


def expire_lease(dsn: str, schema: str, job_id: int, seconds_ago: float = 1.0) -> None:
    """Make a lease look expired by moving its expiry into the past (database clock)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL(
                "UPDATE {}.jobs SET lease_expires_at = now() - make_interval(secs => %s) "
                "WHERE id = %s AND status = 'running'"
            ).format(sql.Identifier(schema)),
            (seconds_ago, job_id),
        )


def make_available(dsn: str, schema: str) -> None:
    """Pull every scheduled retry forward to now, instead of sleeping through back-off."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL("UPDATE {}.jobs SET available_at = now() WHERE status = 'pending'").format(
                sql.Identifier(schema)
            )
        )


def rows(dsn: str, query: str, schema: str, *params: Any) -> list[tuple[Any, ...]]:
    """Run a query where ``{s}`` stands for the quoted schema."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        q = sql.SQL(query).format(s=sql.Identifier(schema))
        return conn.execute(q, params).fetchall()


def run_sql(dsn: str, query: str, schema: str, *params: Any) -> None:
    """Execute a statement (no result expected) where ``{s}`` stands for the quoted schema."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL(query).format(s=sql.Identifier(schema)), params or None)


def claim_waits_on_a_lock(dsn: str, schema: str) -> bool:
    """A claim statement on this schema is waiting for a lock (tests hold one on purpose)."""
    ((n,),) = rows(
        dsn,
        # pg_stat_activity keeps the first 1 kB of a statement (track_activity_query_size):
        # claim_jobs sets the lease token (and names the schema) within that.
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
        "AND query LIKE %s AND query LIKE '%%lease_token = least(j.lease_token%%'",
        schema,
        f"%{schema}%",
    )
    return int(n) > 0
