"""Fan-out with results (ctx.spawn, spawn_many, gather) in process against a real
PostgreSQL: children are spawned once however often the parent reruns, the parent waits
suspended (no lease, no slot) until every child has ended and gets their stored results,
a dead child raises ChildFailed (or comes back as an outcome), and cancelling the parent
cancels its unfinished children."""

from __future__ import annotations

import asyncio
import pathlib
from typing import Any

import psycopg
from psycopg import sql

import leaseq
from leaseq import JobStatus
from tests.support.helpers import rows


def _app(dsn: str, schema: str) -> leaseq.App:
    return leaseq.App(dsn, schema=schema, retry_policy=leaseq.RetryPolicy(base=0.001, cap=0.01))


def _config(**overrides: Any) -> leaseq.WorkerConfig:
    settings: dict[str, Any] = {"poll_interval": 0.05, "lease_seconds": 30, "drain": True}
    settings.update(overrides)
    return leaseq.WorkerConfig(**settings)


def _status(client: leaseq.Client, job_id: int) -> JobStatus | None:
    job = client.get_job(job_id)
    return None if job is None else job.status


async def test_children_are_spawned_once_and_their_results_gathered(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    app = _app(dsn, schema)
    parent_runs: list[int] = []

    @app.task(name="square", store_result=True)
    async def square(ctx: leaseq.JobContext, payload: Any) -> int:
        await asyncio.sleep(0.2)
        return int(payload["n"]) ** 2

    @app.task(name="fan", store_result=True)
    def fan(ctx: leaseq.JobContext, payload: Any) -> int:
        parent_runs.append(ctx.attempt)
        ids = ctx.spawn_many([("square", {"n": n}) for n in (1, 2, 3)])
        one_more = ctx.spawn("square", {"n": 4}, priority=5)
        return sum(ctx.gather([*ids, one_more], poll=0.1))

    parent = client.enqueue("fan")
    worker = leaseq.Worker(app, _config(concurrency=2))
    run = asyncio.create_task(worker.run())
    for _ in range(400):
        if _status(client, parent) is JobStatus.SUSPENDED:
            break
        await asyncio.sleep(0.05)
    ((owner, reason),) = rows(
        dsn, "SELECT lease_owner, suspend_reason FROM {s}.jobs WHERE id = %s", schema, parent
    )
    assert (owner, reason) == (None, "children"), "the parent holds no lease while it waits"
    await asyncio.wait_for(run, 60)
    assert client.result(parent, timeout=5) == 1 + 4 + 9 + 16
    assert len(parent_runs) >= 2, "the parent ran again after its children ended"
    children = rows(
        dsn, "SELECT step, child_id FROM {s}.job_children WHERE parent_id = %s", schema, parent
    )
    assert sorted(s for s, _ in children) == ["spawn-1"] * 3 + ["spawn-2"]
    ((total,),) = rows(dsn, "SELECT count(*) FROM {s}.jobs WHERE task = 'square'", schema)
    assert total == 4, "spawned once however often the parent ran"


async def test_a_dead_child_raises_and_a_cancelled_parent_cancels_its_children(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    app = _app(dsn, schema)

    @app.task(name="bad", store_result=True)
    def bad(ctx: leaseq.JobContext, payload: Any) -> None:
        raise leaseq.Permanent("NOPE", "this child fails")

    @app.task(name="waits_forever")
    def waits_forever(ctx: leaseq.JobContext, payload: Any) -> None:
        ctx.wait_for("never")

    @app.task(name="strict")
    async def strict(ctx: leaseq.JobContext, payload: Any) -> None:
        (child,) = await ctx.spawn_many_async([("bad", None)])
        await ctx.gather_async([child], poll=0.1)

    @app.task(name="lenient", store_result=True)
    async def lenient(ctx: leaseq.JobContext, payload: Any) -> Any:
        child = await ctx.spawn_async("bad")
        (outcome,) = await ctx.gather_async([child], poll=0.1, return_failures=True)
        return outcome["status"], outcome["error_code"]

    @app.task(name="boss")
    def boss(ctx: leaseq.JobContext, payload: Any) -> None:
        ids = ctx.spawn_many([("waits_forever", None), ("waits_forever", None)])
        ctx.gather(ids, poll=30)

    strict_id, lenient_id = client.enqueue("strict"), client.enqueue("lenient")
    await asyncio.wait_for(leaseq.Worker(app, _config()).run(), 60)
    job = client.get_job(strict_id)
    assert (
        job is not None and job.status is JobStatus.DEAD and job.last_error_code == "CHILD_FAILED"
    )
    assert "ended dead" in (job.last_error_detail or "")
    assert client.result(lenient_id, timeout=5) == ["dead", "NOPE"]

    boss_id = client.enqueue("boss")
    worker = leaseq.Worker(app, _config(drain=False))
    run = asyncio.create_task(worker.run())
    for _ in range(400):
        states = rows(dsn, "SELECT status::text FROM {s}.jobs WHERE task = 'waits_forever'", schema)
        if _status(client, boss_id) is JobStatus.SUSPENDED and [s for (s,) in states] == [
            "suspended",
            "suspended",
        ]:
            break
        await asyncio.sleep(0.05)
    assert client.cancel(boss_id, actor="ops", reason="not needed")
    worker.stop()
    await asyncio.wait_for(run, 30)
    assert _status(client, boss_id) is JobStatus.CANCELLED
    states = rows(dsn, "SELECT status::text FROM {s}.jobs WHERE task = 'waits_forever'", schema)
    assert [s for (s,) in states] == ["cancelled", "cancelled"], "its children went with it"


async def test_the_fan_out_example_of_docs_durable_runs_as_pasted(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    page = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "durable.md").read_text()
    (block,) = [b.split("```", 1)[0] for b in page.split("```python\n")[1:] if "album" in b]
    app = _app(dsn, schema)
    exec(compile(block, "docs/durable.md", "exec"), {"app": app, "leaseq": leaseq})
    job_id = client.enqueue("album", {"images": ["a", "b"]})
    await asyncio.wait_for(leaseq.Worker(app, _config()).run(), 60)
    assert client.result(job_id, timeout=5) == ["a-small.png", "b-small.png"]


async def test_the_sql_apis_cancel_cascades_to_children_and_grandchildren(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    app = _app(dsn, schema)

    @app.task(name="waits_forever")
    def waits_forever(ctx: leaseq.JobContext, payload: Any) -> None:
        ctx.wait_for("never")

    @app.task(name="middle")
    def middle(ctx: leaseq.JobContext, payload: Any) -> None:
        ctx.gather([ctx.spawn("waits_forever")], poll=30)

    @app.task(name="top")
    def top(ctx: leaseq.JobContext, payload: Any) -> None:
        ctx.gather(ctx.spawn_many([("waits_forever", None), ("middle", None)]), poll=30)

    top_id, bystander = client.enqueue("top"), client.enqueue("waits_forever")
    worker = leaseq.Worker(app, _config(drain=False))
    run = asyncio.create_task(worker.run())
    every = "SELECT task, status::text FROM {s}.jobs WHERE id <> %s ORDER BY id"
    for _ in range(400):
        found = rows(dsn, every, schema, bystander)
        if len(found) == 4 and {s for _, s in found} == {"suspended"}:
            break
        await asyncio.sleep(0.05)
    with psycopg.connect(dsn, autocommit=True) as conn:
        q = sql.SQL("SELECT {}.cancel(%s, 'ops', 'not needed')").format(sql.Identifier(schema))
        assert conn.execute(q, (top_id,)).fetchone() == (True,)
    worker.stop()
    await asyncio.wait_for(run, 30)
    assert rows(dsn, every, schema, bystander) == [
        ("top", "cancelled"),
        ("waits_forever", "cancelled"),
        ("middle", "cancelled"),
        ("waits_forever", "cancelled"),
    ], "the job, its children and theirs, in one call"
    assert _status(client, bystander) is JobStatus.SUSPENDED, "no other job touched"
    actors = rows(
        dsn, "SELECT DISTINCT actor, detail FROM {s}.job_events WHERE event = 'cancelled'", schema
    )
    assert actors == [("ops", "not needed")]
