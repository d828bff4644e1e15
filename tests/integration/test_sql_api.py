"""The SQL API (migration 0020, docs/sql-api.md) against a real PostgreSQL: enqueue one and
many from SQL in the schema leaseq was migrated into, the NOTIFY wake-up, unique keys with
their policy, ordering keys, dependencies, batches, reads and cancel, errors under
leaseq's SQLSTATEs; a job enqueued from SQL run by a real worker; an AFTER INSERT trigger
on an application table that enqueues, committing or rolling back with the row."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import psycopg
import pytest
from psycopg import sql

import leaseq
from leaseq.errors import SQLSTATES, ConfigError, PayloadError, UniqueConflict


def call(dsn: str, schema: str, text: str, params: Any = None) -> Any:
    """One statement in its own committed transaction; its first column of the first row."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(sql.SQL(text).format(s=sql.Identifier(schema)), params).fetchone()
        return None if row is None else row[0]


def refusal(dsn: str, schema: str, text: str, params: Any = None) -> tuple[str | None, str]:
    """The SQLSTATE and the (one-line) message of a refused statement."""
    with pytest.raises(psycopg.Error) as caught:
        call(dsn, schema, text, params)
    message = caught.value.diag.message_primary or ""
    assert "\n" not in message
    return caught.value.sqlstate, message


def test_enqueue_from_sql_is_a_job_like_any_other(
    client: leaseq.Client, dsn: str, schema: str
) -> None:
    job_id = call(
        dsn,
        schema,
        "SELECT {s}.enqueue('emails.send', '{{\"to\": \"a@example.com\"}}', queue => 'emails',"
        " priority => 5, max_attempts => 3, idempotency_key => 'ik')",
    )
    job = client.get_job(job_id)
    assert (job.task, job.queue, job.payload, job.priority, job.max_attempts) == (
        "emails.send",
        "emails",
        {"to": "a@example.com"},
        5,
        3,
    )
    assert job.idempotency_key == "ik"
    assert call(dsn, schema, "SELECT {s}.job_state(%s)", (job_id,)) == "pending"
    assert call(dsn, schema, "SELECT {s}.job_state(%s)", (job_id + 1000,)) is None


def test_enqueue_wakes_listeners_at_commit_only(
    client: leaseq.Client, dsn: str, schema: str
) -> None:
    channel = f"leaseq.{schema}"
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
        with psycopg.connect(dsn) as conn:
            conn.execute(
                sql.SQL("SELECT {}.enqueue('t', queue => 'wq')").format(sql.Identifier(schema))
            )
            conn.rollback()
            conn.execute(
                sql.SQL("SELECT {}.enqueue('t', queue => 'later', delay => 60)").format(
                    sql.Identifier(schema)
                )
            )
            conn.execute(
                sql.SQL("SELECT {}.enqueue('t', queue => 'wq')").format(sql.Identifier(schema))
            )
            conn.commit()
        got = [n.payload for n in listener.notifies(timeout=2, stop_after=1)]
    assert got == ["wq"]


def test_enqueue_many_in_input_order_and_all_or_nothing(
    client: leaseq.Client, dsn: str, schema: str
) -> None:
    ids = call(
        dsn,
        schema,
        "SELECT {s}.enqueue_many(%s::jsonb)",
        (
            '[{"task": "a", "payload": 1}, {"task": "b", "ordering_key": "k"},'
            ' {"task": "c", "ordering_key": "k"}]',
        ),
    )
    assert [client.get_job(i).task for i in ids] == ["a", "b", "c"]
    assert ids == sorted(ids)
    state, err = refusal(
        dsn,
        schema,
        "SELECT {s}.enqueue_many(%s::jsonb)",
        ('[{"task": "d"}, {"task": "e", "priority": "x"}]',),
    )
    assert state == "LQ001" and "priority must be an integer" in err
    with psycopg.connect(dsn) as conn:
        n = conn.execute(
            sql.SQL("SELECT count(*) FROM {}.jobs").format(sql.Identifier(schema))
        ).fetchone()
    assert n is not None and n[0] == 3


def test_errors_carry_leaseqs_sqlstates_and_one_line(
    client: leaseq.Client, dsn: str, schema: str
) -> None:
    state, err = refusal(dsn, schema, "SELECT {s}.enqueue('bad name!')")
    assert state == "LQ001" and SQLSTATES["LQ001"] is ConfigError
    assert "invalid task name" in err
    big = '"' + "x" * (1024 * 1024) + '"'
    state, err = refusal(dsn, schema, "SELECT {s}.enqueue('t', %s::jsonb)", (big,))
    assert state == "LQ002" and SQLSTATES["LQ002"] is PayloadError
    call(dsn, schema, "SELECT {s}.enqueue('t', unique_key => 'u1')")
    state, err = refusal(
        dsn, schema, "SELECT {s}.enqueue('t', unique_key => 'u1', on_conflict => 'raise')"
    )
    assert state == "LQ003" and SQLSTATES["LQ003"] is UniqueConflict
    assert "unique key 'u1' is held by job" in err


def test_unique_keys_skip_and_replace(client: leaseq.Client, dsn: str, schema: str) -> None:
    first = call(dsn, schema, "SELECT {s}.enqueue('t', '1', unique_key => 'k')")
    again = call(dsn, schema, "SELECT {s}.enqueue('t', '2', unique_key => 'k')")
    assert again == first and client.get_job(first).payload == 1
    replaced = call(
        dsn, schema, "SELECT {s}.enqueue('t', '3', unique_key => 'k', on_conflict => 'replace')"
    )
    assert replaced == first and client.get_job(first).payload == 3
    # Python sees the key as held by the job SQL stored.
    assert client.enqueue("t", 4, unique_key="k") == first


def test_dependencies_and_cancel(client: leaseq.Client, dsn: str, schema: str) -> None:
    parent = client.enqueue("p")
    child = call(
        dsn, schema, "SELECT {s}.enqueue('c', depends_on => ARRAY[%s]::bigint[])", (parent,)
    )
    assert [d.job_id for d in client.dependencies(child)] == [parent]
    state, err = refusal(
        dsn, schema, "SELECT {s}.enqueue('c', depends_on => ARRAY[99999999]::bigint[])"
    )
    assert state == "LQ001" and "do not exist: 99999999" in err
    assert call(dsn, schema, "SELECT {s}.cancel(%s, 'ops', 'not needed')", (parent,)) is True
    assert call(dsn, schema, "SELECT {s}.job_state(%s)", (parent,)) == "cancelled"
    # The dependent was decided in the same transaction: cancelled for its dependency.
    assert call(dsn, schema, "SELECT {s}.job_state(%s)", (child,)) == "cancelled"
    assert call(dsn, schema, "SELECT {s}.cancel(%s)", (parent,)) is False


def test_cancel_promotes_the_next_job_of_an_ordering_key(
    client: leaseq.Client, dsn: str, schema: str
) -> None:
    ids = call(
        dsn,
        schema,
        "SELECT {s}.enqueue_many(%s::jsonb)",
        ('[{"task": "a", "ordering_key": "o"}, {"task": "b", "ordering_key": "o"}]',),
    )
    with psycopg.connect(dsn) as conn:
        q = sql.SQL("SELECT blocked FROM {}.jobs WHERE id = %s").format(sql.Identifier(schema))
        assert conn.execute(q, (ids[1],)).fetchone() == (True,)
    assert call(dsn, schema, "SELECT {s}.cancel(%s)", (ids[0],)) is True
    with psycopg.connect(dsn) as conn:
        assert conn.execute(q, (ids[1],)).fetchone() == (False,)


def test_a_job_enqueued_from_sql_runs_on_a_worker_and_its_result_reads_back(
    dsn: str, schema: str
) -> None:
    app = leaseq.App(dsn, schema=schema)

    @app.task(name="add", store_result=True)
    def add(ctx: leaseq.JobContext, payload: dict[str, int]) -> int:
        return payload["a"] + payload["b"]

    app.client.migrate()
    try:
        job_id = call(dsn, schema, "SELECT {s}.enqueue('add', '{{\"a\": 2, \"b\": 3}}')")
        config = leaseq.WorkerConfig(poll_interval=0.02, drain=True)
        asyncio.run(leaseq.Worker(app, config).run())
        with psycopg.connect(dsn) as conn:
            row = conn.execute(
                sql.SQL("SELECT status, has_value, value FROM {}.job_result(%s)").format(
                    sql.Identifier(schema)
                ),
                (job_id,),
            ).fetchone()
        assert row == ("succeeded", True, 5)
    finally:
        app.client.close()


def test_a_trigger_enqueues_with_its_row(client: leaseq.Client, dsn: str, schema: str) -> None:
    s = sql.Identifier(schema)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL("CREATE TABLE {}.signups (id serial PRIMARY KEY, email text)").format(s)
        )
        conn.execute(
            sql.SQL(
                "CREATE FUNCTION {s}.signup_job() RETURNS trigger LANGUAGE plpgsql AS $$"
                " BEGIN PERFORM {s}.enqueue('emails.welcome',"
                " jsonb_build_object('email', NEW.email), queue => 'emails');"
                " RETURN NEW; END $$"
            ).format(s=s)
        )
        conn.execute(
            sql.SQL(
                "CREATE TRIGGER signup_job AFTER INSERT ON {s}.signups"
                " FOR EACH ROW EXECUTE FUNCTION {s}.signup_job()"
            ).format(s=s)
        )
    with psycopg.connect(dsn) as conn:
        conn.execute(
            sql.SQL("INSERT INTO {}.signups (email) VALUES ('kept@example.com')").format(s)
        )
        conn.commit()
        conn.execute(
            sql.SQL("INSERT INTO {}.signups (email) VALUES ('gone@example.com')").format(s)
        )
        conn.rollback()
        # A refused enqueue refuses the row too.
        conn.execute(
            sql.SQL(
                "CREATE OR REPLACE FUNCTION {s}.signup_job() RETURNS trigger LANGUAGE plpgsql"
                " AS $$ BEGIN PERFORM {s}.enqueue('bad name!'); RETURN NEW; END $$"
            ).format(s=s)
        )
        conn.commit()
        with pytest.raises(psycopg.Error) as caught:
            insert = "INSERT INTO {}.signups (email) VALUES ('bad@example.com')"
            conn.execute(sql.SQL(insert).format(s))
        assert caught.value.sqlstate == "LQ001"
        conn.rollback()
        rows = conn.execute(sql.SQL("SELECT email FROM {}.signups").format(s)).fetchall()
        jobs = conn.execute(
            sql.SQL("SELECT payload->>'email' FROM {}.jobs WHERE task = 'emails.welcome'").format(s)
        ).fetchall()
    assert rows == [("kept@example.com",)]
    assert jobs == [("kept@example.com",)]


def test_sql_and_python_enqueues_racing_for_one_unique_key(
    client: leaseq.Client, dsn: str, schema: str
) -> None:
    """The unique key is the database's (the primary key of unique_keys, taken in the
    insert's statement): SQL and Python enqueuing the same key at once from several
    connections end with one live job, the id every one of them was given."""
    ids: list[int] = []
    errors: list[BaseException] = []
    start = threading.Barrier(6)

    def from_sql() -> None:
        try:
            with psycopg.connect(dsn, autocommit=True) as conn:
                q = sql.SQL("SELECT {}.enqueue('t', unique_key => 'race')").format(
                    sql.Identifier(schema)
                )
                start.wait()
                for _ in range(15):
                    row = conn.execute(q).fetchone()
                    assert row is not None
                    ids.append(int(row[0]))
        except BaseException as exc:
            errors.append(exc)

    def from_python() -> None:
        try:
            with leaseq.Client(dsn, schema=schema) as own:
                start.wait()
                ids.extend(int(own.enqueue("t", unique_key="race")) for _ in range(15))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=f) for f in [from_sql] * 3 + [from_python] * 3]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    assert len(ids) == 90 and len(set(ids)) == 1
    with psycopg.connect(dsn) as conn:
        live = conn.execute(
            sql.SQL(
                "SELECT count(*) FROM {}.jobs WHERE unique_key = 'race'"
                " AND status IN ('pending', 'running')"
            ).format(sql.Identifier(schema))
        ).fetchone()
    assert live == (1,)
