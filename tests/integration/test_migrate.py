"""Migrations: versioned, recorded, idempotent, safe when run by many processes at once."""

from __future__ import annotations

import subprocess
import sys

import psycopg
import pytest

import leaseq
from leaseq.sql import latest_version
from tests.support.helpers import rows, run_sql


def test_migrate_records_version_and_is_idempotent(dsn: str, schema: str) -> None:
    c = leaseq.Client(dsn, schema=schema)
    try:
        assert c.schema_version() is None
        with pytest.raises(leaseq.SchemaError, match="leaseq migrate"):
            c.check_schema()
        assert c.migrate() == latest_version()
        assert c.migrate() == latest_version()
        assert c.check_schema() == latest_version()
        recorded = rows(dsn, "SELECT version, name FROM {s}.schema_version", schema)
        assert [v for v, _ in recorded] == list(range(1, latest_version() + 1))
    finally:
        c.close()


@pytest.mark.slow  # six Python processes started at once
def test_many_processes_migrating_at_once_all_succeed(dsn: str, schema: str) -> None:
    code = (
        "import leaseq, sys; "
        f"c = leaseq.Client({dsn!r}, schema={schema!r}); print(c.migrate()); c.close()"
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        for _ in range(6)
    ]
    outputs = [p.communicate(timeout=60) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err.decode() for _, err in outputs]
    assert {out.strip() for out, _ in outputs} == {str(latest_version()).encode()}
    ((count,),) = rows(dsn, "SELECT count(*) FROM {s}.schema_version", schema)
    assert count == latest_version()


def test_schema_newer_than_the_code_is_refused(
    client: leaseq.Client, dsn: str, schema: str
) -> None:
    run_sql(dsn, "INSERT INTO {s}.schema_version (version, name) VALUES (999, 'future')", schema)
    with pytest.raises(leaseq.SchemaError, match="newer than this leaseq"):
        client.check_schema()
    with pytest.raises(leaseq.SchemaError, match="upgrade leaseq"):
        client.migrate()


def test_schemas_are_independent(dsn: str, schema: str, client: leaseq.Client) -> None:
    other = leaseq.Client(dsn, schema=schema + "_b")
    try:
        other.migrate()
        client.enqueue("t")
        assert other.claim(worker="w") == []
    finally:
        run_sql(dsn, "DROP SCHEMA {s} CASCADE", schema + "_b")
        other.close()


def test_claim_uses_the_partial_index_on_a_backlog(
    client: leaseq.Client, dsn: str, schema: str
) -> None:
    client.enqueue_many([{"task": "t", "queue": f"q{i % 5}"} for i in range(20000)])
    run_sql(dsn, "ANALYZE {s}.jobs", schema)
    params = {"queue": "q1", "owner": "w", "lease_seconds": 30, "limit": 10}
    with psycopg.connect(dsn) as conn:
        plan = "\n".join(
            row[0] for row in conn.execute("EXPLAIN " + client.queries["claim_jobs"], params)
        )
        conn.rollback()
    assert "jobs_claimable_idx" in plan, plan
    assert "Sort" not in plan, plan
