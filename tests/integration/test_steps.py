"""Durable steps (ctx.step), in process against a real PostgreSQL: a finished step is
answered from its record on every later attempt, in-database work inside a step commits with
its record (once), a stale lease records nothing and its work rolls back, misuse and changed
order end the job dead with a clear code, retention and purge take the records with the job.
"""

from __future__ import annotations

import asyncio
import pathlib
from typing import Any

import psycopg
import pytest
from psycopg import sql

import leaseq
from leaseq import JobStatus
from leaseq.errors import Retry
from leaseq.params import default_idempotency_key
from tests.support.helpers import expire_lease, rows, run_sql


def _app(dsn: str, schema: str) -> leaseq.App:
    return leaseq.App(dsn, schema=schema, retry_policy=leaseq.RetryPolicy(base=0.001, cap=0.01))


def _config(**overrides: Any) -> leaseq.WorkerConfig:
    settings: dict[str, Any] = {"poll_interval": 0.05, "lease_seconds": 30, "drain": True}
    settings.update(overrides)
    return leaseq.WorkerConfig(**settings)


def _ledger(dsn: str, schema: str) -> sql.Composed:
    run_sql(dsn, "CREATE TABLE {s}.ledger (job_id bigint, step text, token bigint)", schema)
    return sql.SQL("INSERT INTO {}.ledger VALUES (%s, %s, %s)").format(sql.Identifier(schema))


def _ledger_rows(dsn: str, schema: str) -> list[tuple[Any, ...]]:
    return rows(dsn, "SELECT job_id, step, token FROM {s}.ledger ORDER BY step", schema)


def _steps(dsn: str, schema: str, job_id: int) -> list[tuple[Any, ...]]:
    return rows(
        dsn,
        "SELECT name, seq, attempt, result FROM {s}.job_steps WHERE job_id = %s ORDER BY seq",
        schema,
        job_id,
    )


async def test_sync_steps_run_once_across_attempts_and_db_work_commits_with_the_record(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    app = _app(dsn, schema)
    insert = _ledger(dsn, schema)
    calls: list[tuple[str, int]] = []

    def fetch(n: int) -> dict[str, Any]:
        calls.append(("fetch", n))
        return {"n": n, "t": (1, 2)}  # a tuple: the record gives back a list, both times

    @app.task(name="three", store_result=True)
    def three(ctx: leaseq.JobContext, payload: Any) -> Any:
        first = ctx.step("fetch", fetch, 7)

        def book() -> str:
            calls.append(("book", ctx.attempt))
            with ctx.transaction() as conn:
                conn.execute(insert, (ctx.job_id, "book", ctx.fencing_token))
            return "booked"

        second = ctx.step("book", book)
        if ctx.attempt == 1:
            raise Retry("FLAKY", "fails after two steps", retry_in=0)
        third = ctx.step("last", lambda: calls.append(("last", ctx.attempt)) or 3)
        return [first, second, third, ctx.step_key("book")]

    job_id = client.enqueue("three")
    stats = await asyncio.wait_for(leaseq.Worker(app, _config()).run(), 60)
    job = client.get_job(job_id)
    assert job is not None and job.status is JobStatus.SUCCEEDED and job.attempt_count == 2
    assert stats.succeeded == 1
    assert calls == [("fetch", 7), ("book", 1), ("last", 2)], "no step ran twice"
    assert _ledger_rows(dsn, schema) == [(job_id, "book", 1)], "the step's write, once"
    assert _steps(dsn, schema, job_id) == [
        ("fetch", 0, 1, {"n": 7, "t": [1, 2]}),
        ("book", 1, 1, "booked"),
        ("last", 2, 2, 3),
    ]
    result = client.result(job_id, timeout=5)
    assert result[:3] == [{"n": 7, "t": [1, 2]}, "booked", 3]
    assert job.created_at is not None
    key = default_idempotency_key(job_id, job.created_at)
    assert result[3] == f"{key}:step:book", "stable across attempts, one per step"
    records = client.job_steps(job_id)
    assert [(r.name, r.seq, r.lease_token) for r in records] == [
        ("fetch", 0, 1),
        ("book", 1, 1),
        ("last", 2, 2),
    ]


async def test_async_steps_and_a_step_that_raised_runs_again(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    app = _app(dsn, schema)
    insert = _ledger(dsn, schema)
    calls: list[str] = []

    @app.task(name="async_steps")
    async def async_steps(ctx: leaseq.JobContext, payload: Any) -> None:
        async def charge() -> int:
            calls.append(f"charge{ctx.attempt}")
            async with ctx.transaction() as conn:
                await conn.execute(insert, (ctx.job_id, "charge", ctx.fencing_token))
                if not calls[:-1]:
                    raise RuntimeError("the step's work rolls back")
            return 1

        try:
            await ctx.step_async("charge", charge)
        except RuntimeError:
            await ctx.step_async("charge", charge)  # not recorded: the same name may retry
        await ctx.step_async("plain", lambda: calls.append("plain"))
        if ctx.attempt == 1:
            raise Retry("AGAIN", retry_in=0)

    job_id = client.enqueue("async_steps")
    await asyncio.wait_for(leaseq.Worker(app, _config()).run(), 60)
    job = client.get_job(job_id)
    assert job is not None and job.status is JobStatus.SUCCEEDED and job.attempt_count == 2
    assert calls == ["charge1", "charge1", "plain"], "a recorded step never ran again"
    assert len(_ledger_rows(dsn, schema)) == 1, "the raised step's write rolled back"
    assert [s[:2] for s in _steps(dsn, schema, job_id)] == [("charge", 0), ("plain", 1)]


async def test_a_name_used_twice_and_a_changed_order_end_the_job_dead(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    app = _app(dsn, schema)

    @app.task(name="twice")
    def twice(ctx: leaseq.JobContext, payload: Any) -> None:
        ctx.step("a", lambda: 1)
        ctx.step("a", lambda: 2)

    @app.task(name="reordered")
    def reordered(ctx: leaseq.JobContext, payload: Any) -> None:
        names = ["a", "b"] if ctx.attempt == 1 else ["b", "a"]
        for name in names:
            ctx.step(name, str, name)
        if ctx.attempt == 1:
            raise Retry("AGAIN", retry_in=0)

    @app.task(name="renamed")
    def renamed(ctx: leaseq.JobContext, payload: Any) -> None:
        ctx.step("a" if ctx.attempt == 1 else "z", lambda: 1)
        if ctx.attempt == 1:
            raise Retry("AGAIN", retry_in=0)

    @app.task(name="nested")
    def nested(ctx: leaseq.JobContext, payload: Any) -> None:
        ctx.step("outer", lambda: ctx.step("inner", lambda: 1))

    @app.task(name="unrecordable")
    def unrecordable(ctx: leaseq.JobContext, payload: Any) -> None:
        ctx.step("obj", object)

    ids = {name: client.enqueue(name) for name in app.tasks}
    await asyncio.wait_for(leaseq.Worker(app, _config()).run(), 60)
    expected = {
        "twice": ("STEP_NAME_REUSED", "called twice in one run"),
        "reordered": (
            "STEP_OUT_OF_ORDER",
            "'b' was recorded as step 2 and is now called as step 1",
        ),
        "renamed": ("STEP_OUT_OF_ORDER", "step 1 was recorded as 'a' and is now called 'z'"),
        "nested": ("STEP_NAME_REUSED", "steps do not nest"),
        "unrecordable": ("STEP_RESULT_INVALID", "cannot be recorded"),
    }
    for name, (code, words) in expected.items():
        job = client.get_job(ids[name])
        assert job is not None and job.status is JobStatus.DEAD, name
        assert job.last_error_code == code, (name, job.last_error_code, job.last_error_detail)
        assert words in (job.last_error_detail or ""), (name, job.last_error_detail)
    assert [s[0] for s in _steps(dsn, schema, ids["twice"])] == ["a"]


async def test_a_stale_lease_records_no_step_and_its_work_rolls_back(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    app = _app(dsn, schema)
    insert = _ledger(dsn, schema)
    inside, gate = asyncio.Event(), asyncio.Event()
    outcome: dict[str, Any] = {}

    @app.task(name="stale")
    async def stale(ctx: leaseq.JobContext, payload: Any) -> None:
        async def work() -> str:
            async with ctx.transaction() as conn:
                await conn.execute(insert, (ctx.job_id, "work", ctx.fencing_token))
            if ctx.attempt == 1:
                inside.set()
                await gate.wait()  # the lease runs out here, and another worker takes over
            return f"token {ctx.fencing_token}"

        try:
            outcome[ctx.attempt] = await ctx.step_async("work", work)
        except leaseq.LeaseLost as exc:
            outcome["lost"] = str(exc)
            raise

    job_id = client.enqueue("stale")
    a = leaseq.Worker(app, _config(drain=False, lease_seconds=30))
    run_a = asyncio.create_task(a.run())
    await asyncio.wait_for(inside.wait(), 10)
    expire_lease(dsn, schema, job_id)
    b = leaseq.Worker(app, _config(sweep_interval=0.05))
    await asyncio.wait_for(b.run(), 60)
    gate.set()
    await asyncio.sleep(0.3)
    a.stop()
    await asyncio.wait_for(run_a, 30)
    assert "not recorded" in outcome["lost"]
    assert outcome[2] == "token 2"
    assert _ledger_rows(dsn, schema) == [(job_id, "work", 2)], "the stale write rolled back"
    assert [(s[0], s[2]) for s in _steps(dsn, schema, job_id)] == [("work", 2)]


def test_the_record_is_fenced_and_unique(dsn: str, schema: str, client: leaseq.Client) -> None:
    job_id = client.enqueue("t")
    (lease,) = client.claim(worker="w1", lease_seconds=30)
    assert client.step_record(lease, "s", 0, 1)
    assert not client.step_record(lease, "s", 1, 2), "one record per (job, name)"
    assert not client.step_record(lease, "other", 0, 2), "one record per place"
    expire_lease(dsn, schema, job_id)
    assert not client.step_record(lease, "late", 1, 3), "the fence refuses an ended lease"
    with pytest.raises(psycopg.errors.CheckViolation):
        run_sql(
            dsn,
            "INSERT INTO {s}.job_steps (job_id, name, seq, attempt, lease_token)"
            " VALUES (%s, 'neg', -1, 1, 1)",
            schema,
            job_id,
        )
    assert [s[0] for s in _steps(dsn, schema, job_id)] == ["s"]


async def test_prune_and_purge_delete_step_and_effect_records_with_their_jobs(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    app = _app(dsn, schema)

    @app.task(name="kid")
    def kid(ctx: leaseq.JobContext, payload: Any) -> None:
        return None

    @app.task(name="done")
    def done(ctx: leaseq.JobContext, payload: Any) -> None:
        ctx.step("s", lambda: 1)
        ctx.effect("e", lambda key: key)
        ctx.spawn("kid", {})  # a step too: its children link and its gate row

    @app.task(name="dies")
    def dies(ctx: leaseq.JobContext, payload: Any) -> None:
        ctx.step("s", lambda: 1)
        ctx.effect("e", lambda key: key)
        raise leaseq.Permanent("NO")

    finished, dead = client.enqueue("done"), client.enqueue("dies")
    await asyncio.wait_for(leaseq.Worker(app, _config()).run(), 60)
    assert len(_steps(dsn, schema, finished)) == 2 and len(_steps(dsn, schema, dead)) == 1
    assert rows(dsn, "SELECT count(*) FROM {s}.job_effects", schema) == [(2,)]
    links = "SELECT (SELECT count(*) FROM {s}.job_children), (SELECT count(*) FROM {s}.job_fanin)"
    assert rows(dsn, links, schema) == [(1, 1)]
    run_sql(dsn, "UPDATE {s}.jobs SET finished_at = now() - interval '2 days'", schema)
    assert client.prune(older_than=3600) >= 1
    assert client.purge_dead(task="dies", reason="test", actor="t") == 1
    assert client.get_job(finished) is None and client.get_job(dead) is None
    assert rows(dsn, "SELECT count(*) FROM {s}.job_steps", schema) == [(0,)]
    assert rows(dsn, links, schema) == [(0, 0)], "the parent's links and gate go with it"
    # A purged dead job's effect records go with it (they may hold its data: results).
    assert rows(dsn, "SELECT count(*) FROM {s}.job_effects", schema) == [(0,)]


async def test_the_example_of_docs_durable_runs_as_pasted(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    page = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "durable.md").read_text()
    block = page.split("```python\n", 1)[1].split("```", 1)[0]
    block = block.replace("app = leaseq.App()", "")  # the test's app, on its schema
    app = _app(dsn, schema)
    exec(compile(block, "docs/durable.md", "exec"), {"app": app, "__name__": "docs_durable"})
    order = {"id": 7, "seats": 2}
    job_id = client.enqueue("book_trip", order)
    other = client.enqueue("book_trip_async", order)
    await asyncio.wait_for(leaseq.Worker(app, _config()).run(), 60)
    seats, key = client.result(job_id, timeout=5)
    assert seats == {"order": 7, "seats": 2} and key.endswith(":step:charge")
    assert [s[0] for s in _steps(dsn, schema, job_id)] == ["reserve", "charge"]
    assert [s[0] for s in _steps(dsn, schema, other)] == ["reserve"]


async def test_patched_branches_old_and_new_in_flight_jobs(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    app = _app(dsn, schema)
    deployed = {"new": False}
    ran: list[tuple[int, str]] = []

    @app.task(name="evolving", store_result=True)
    def evolving(ctx: leaseq.JobContext, payload: Any) -> Any:
        ctx.step("a", lambda: ran.append((ctx.job_id, "a")))
        if deployed["new"] and ctx.patched("v2"):
            second = ctx.step("new-b", lambda: ran.append((ctx.job_id, "new-b")) or "new")
        else:
            second = ctx.step("old-b", lambda: ran.append((ctx.job_id, "old-b")) or "old")
        if ctx.attempt == 1:
            raise Retry("AGAIN", retry_in=0)
        return second

    old_job = client.enqueue("evolving")
    # The old code runs the first attempt only (the drain stops after it is retried).
    worker = leaseq.Worker(app, _config(drain=False))
    run = asyncio.create_task(worker.run())
    for _ in range(200):
        if (old_job, "old-b") in ran:
            break
        await asyncio.sleep(0.05)
    worker.stop()
    await asyncio.wait_for(run, 30)
    deployed["new"] = True  # the deploy: the in-flight job goes on, a new one starts
    new_job = client.enqueue("evolving")
    await asyncio.wait_for(leaseq.Worker(app, _config()).run(), 60)
    assert client.result(old_job, timeout=5) == "old", "in flight before: the old branch"
    assert client.result(new_job, timeout=5) == "new", "and stays new on its rerun"
    assert [s[0] for s in _steps(dsn, schema, old_job)] == ["a", "old-b"]
    assert [s[0] for s in _steps(dsn, schema, new_job)] == ["a", "patch:v2", "new-b"]
    assert ran.count((old_job, "old-b")) == ran.count((new_job, "new-b")) == 1


async def test_restart_from_a_step_keeps_the_records_before_it(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    app = _app(dsn, schema)
    ran: list[str] = []
    fixed = {"c": False}

    @app.task(name="pipeline", store_result=True)
    def pipeline(ctx: leaseq.JobContext, payload: Any) -> Any:
        out = [ctx.step(n, lambda n=n: ran.append(n) or n) for n in ("a", "b")]

        def c() -> str:
            ran.append("c")
            if not fixed["c"]:
                raise leaseq.Permanent("BUG", "step c is broken")
            return "c"

        return [*out, ctx.step("c", c)]

    job_id = client.enqueue("pipeline")
    await asyncio.wait_for(leaseq.Worker(app, _config()).run(), 60)
    assert _status_of(client, job_id) is JobStatus.DEAD
    with pytest.raises(leaseq.InvalidTransition, match="no recorded step 'zz'"):
        client.restart_from_step(job_id, "zz", reason="typo", actor="ops")
    fixed["c"] = True  # the fix is deployed; b must run again (it fed c a bad value)
    assert client.restart_from_step(job_id, "b", reason="b fed c garbage", actor="ops") == ["b"]
    await asyncio.wait_for(leaseq.Worker(app, _config()).run(), 60)
    assert client.result(job_id, timeout=5) == ["a", "b", "c"]
    assert ran == ["a", "b", "c", "b", "c"], "a answered from its record, b and c re-run"
    (replayed,) = [e for e in client.job_events(job_id) if e.event == "replayed"]
    assert replayed.actor == "ops" and "restart from step 'b'" in (replayed.detail or "")
    with pytest.raises(leaseq.InvalidTransition, match="only a dead or cancelled job"):
        client.restart_from_step(job_id, "a", reason="again", actor="ops")


def _status_of(client: leaseq.Client, job_id: int) -> JobStatus | None:
    job = client.get_job(job_id)
    return None if job is None else job.status
