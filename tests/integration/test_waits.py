"""Durable sleep and signals (ctx.sleep, ctx.wait_for, client.signal) in process against a
real PostgreSQL: a sleeping job holds no lease or slot and wakes no earlier than its time,
its attempt is not charged, its finished steps are not run again; a signal is stored once,
found if sent before the wait, wakes a waiting job at once and is delivered once; a timeout
raises WaitTimeout; a suspended job is cancelled at once."""

from __future__ import annotations

import asyncio
import datetime as dt
import pathlib
from typing import Any

import pytest
from prometheus_client import generate_latest

import leaseq
from leaseq import JobStatus
from leaseq.db_metrics import database_registry
from tests.support.helpers import rows


def _app(dsn: str, schema: str) -> leaseq.App:
    return leaseq.App(dsn, schema=schema, retry_policy=leaseq.RetryPolicy(base=0.001, cap=0.01))


def _config(**overrides: Any) -> leaseq.WorkerConfig:
    settings: dict[str, Any] = {"poll_interval": 0.05, "lease_seconds": 30, "drain": True}
    settings.update(overrides)
    return leaseq.WorkerConfig(**settings)


def _trail(dsn: str, schema: str, job_id: int) -> list[tuple[Any, ...]]:
    return rows(
        dsn,
        "SELECT event, from_status::text, to_status::text, at FROM {s}.job_events"
        " WHERE job_id = %s ORDER BY id",
        schema,
        job_id,
    )


async def _until(check: Any, what: str, timeout: float = 30) -> None:
    for _ in range(int(timeout / 0.05)):
        if check():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _status(client: leaseq.Client, job_id: int) -> JobStatus | None:
    job = client.get_job(job_id)
    return None if job is None else job.status


async def test_a_sync_sleep_gives_the_slot_back_and_wakes_no_earlier_than_its_time(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    app = _app(dsn, schema)
    calls: list[str] = []

    @app.task(name="sleeper", store_result=True)
    def sleeper(ctx: leaseq.JobContext, payload: Any) -> Any:
        first = ctx.step("first", lambda: calls.append("first") or "a")
        ctx.sleep(3)  # long enough for the quick job to be enqueued and run meanwhile
        calls.append(f"after sleep, attempt {ctx.attempt}")
        return first

    @app.task(name="quick")
    def quick(ctx: leaseq.JobContext, payload: Any) -> None:
        calls.append("quick")

    job_id = client.enqueue("sleeper")
    worker = leaseq.Worker(app, _config(concurrency=1))
    run = asyncio.create_task(worker.run())
    await _until(lambda: _status(client, job_id) is JobStatus.SUSPENDED, "the job to sleep")
    ((owner, expires, reason, slot),) = rows(
        dsn,
        "SELECT lease_owner, lease_expires_at, suspend_reason, queue_slot FROM {s}.jobs"
        " WHERE id = %s",
        schema,
        job_id,
    )
    assert (owner, expires, reason, slot) == (None, None, "sleep", None), "it holds nothing"
    other = client.enqueue("quick")  # runs on the one slot while the first job sleeps
    await asyncio.wait_for(run, 60)
    job = client.get_job(job_id)
    assert job is not None and job.status is JobStatus.SUCCEEDED
    assert job.attempt_count == 1, "a suspension is not a failure: no attempt charged"
    assert client.result(job_id, timeout=5) == "a"
    assert calls[0] == "first" and calls.count("first") == 1, "the step was not run again"
    assert calls.index("quick") < calls.index("after sleep, attempt 1")
    trail = _trail(dsn, schema, job_id)
    events = [(e, f, t) for e, f, t, _ in trail]
    assert events == [
        ("suspended", "running", "suspended"),
        ("woken", "suspended", "pending"),
    ]
    # The wake-up is fixed when the sleep step is first recorded (now() + 3 s, on the database
    # clock), a moment before the suspension commits: measure from the record, not the trail.
    ((recorded, until),) = rows(
        dsn,
        "SELECT recorded_at, to_timestamp((result->>'until')::float8) FROM {s}.job_steps"
        " WHERE job_id = %s AND name = 'sleep-2'",
        schema,
        job_id,
    )
    assert abs((until - recorded) - dt.timedelta(seconds=3)) < dt.timedelta(milliseconds=1)
    assert trail[0][3] >= recorded, "it suspended after recording its wake-up"
    woken = trail[1][3]
    assert woken >= until, f"woken at {woken}, before its time {until}"
    assert _status(client, other) is JobStatus.SUCCEEDED


async def test_async_sleep_until_and_sleep_in_a_job_with_a_limit_slot(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    app = _app(dsn, schema)
    order: list[str] = []

    @app.task(name="nap")
    async def nap(ctx: leaseq.JobContext, payload: Any) -> None:
        order.append(f"start {payload['n']}")
        await ctx.sleep_until_async(dt.datetime.now(dt.UTC) + dt.timedelta(seconds=0.3))
        order.append(f"end {payload['n']}")

    client.set_limit("queue:default", concurrency=1)
    a = client.enqueue("nap", {"n": 1})
    b = client.enqueue("nap", {"n": 2})
    await asyncio.wait_for(leaseq.Worker(app, _config(concurrency=2)).run(), 60)
    assert _status(client, a) is _status(client, b) is JobStatus.SUCCEEDED
    # Under a queue limit of 1 the second started while the first slept: the slot came back.
    assert order.index("start 2") < order.index("end 1"), order
    assert rows(dsn, "SELECT count(*) FROM {s}.jobs WHERE queue_slot IS NOT NULL", schema) == [(0,)]


async def test_a_signal_sent_before_the_wait_is_found_and_one_sent_during_it_wakes_the_job(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    app = _app(dsn, schema)
    got: list[Any] = []

    @app.task(name="approval", store_result=True)
    def approval(ctx: leaseq.JobContext, payload: Any) -> Any:
        decision = ctx.wait_for("approved", timeout=60)
        got.append(decision)
        return decision

    early = client.enqueue("approval")
    assert client.signal(early, "approved", {"by": "ada"})
    assert client.signal(early, "approved", {"by": "bob"}), "the name's second delivery"
    late = client.enqueue("approval", unique_key="order-7")
    worker = leaseq.Worker(app, _config())
    run = asyncio.create_task(worker.run())
    await _until(lambda: _status(client, late) is JobStatus.SUSPENDED, "the wait to suspend")
    ((reason, signal, wake_at),) = rows(
        dsn, "SELECT suspend_reason, wait_signal, wake_at FROM {s}.jobs WHERE id = %s", schema, late
    )
    assert (reason, signal) == ("signal", "approved") and wake_at is not None
    assert client.signal(None, "approved", {"by": "cy"}, unique_key="order-7", actor="ops")
    await asyncio.wait_for(run, 60)
    assert client.result(early, timeout=5) == {"by": "ada"}, "buffered, the first one"
    stored = rows(dsn, "SELECT seq, payload FROM {s}.job_signals WHERE job_id = %s", schema, early)
    assert sorted(stored) == [(1, {"by": "ada"}), (2, {"by": "bob"})], "one row per delivery"
    assert client.result(late, timeout=5) == {"by": "cy"}
    assert sorted(g["by"] for g in got) == ["ada", "cy"], "each delivered once"
    assert [e for e, *_ in _trail(dsn, schema, late)] == ["suspended", "signalled"]
    (record,) = client.step_records(late)
    assert (record.name, record.result["payload"]) == ("wait:approved", {"by": "cy"})
    assert not client.signal(late, "other"), "a finished job takes no signal"
    with pytest.raises(leaseq.JobNotFound):
        client.signal(10**9, "approved")
    with pytest.raises(leaseq.JobNotFound):
        client.signal(None, "approved", unique_key="nobody-holds-this")


async def test_a_wait_times_out_with_a_clear_exception(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    app = _app(dsn, schema)

    @app.task(name="strict")
    async def strict(ctx: leaseq.JobContext, payload: Any) -> None:
        await ctx.wait_for_async("approved", timeout=0.3)

    @app.task(name="lenient", store_result=True)
    async def lenient(ctx: leaseq.JobContext, payload: Any) -> str:
        try:
            await ctx.wait_for_async("approved", timeout=0.3)
        except leaseq.WaitTimeout:
            return "rejected: nobody approved"
        return "approved"

    strict_id, lenient_id = client.enqueue("strict"), client.enqueue("lenient")
    await asyncio.wait_for(leaseq.Worker(app, _config()).run(), 60)
    job = client.get_job(strict_id)
    assert job is not None and job.status is JobStatus.DEAD
    assert job.last_error_code == "WAIT_TIMEOUT"
    assert "'approved' did not come within 0.3s" in (job.last_error_detail or "")
    assert client.result(lenient_id, timeout=5) == "rejected: nobody approved"


async def test_a_suspended_job_is_cancelled_at_once_and_takes_no_signal(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    app = _app(dsn, schema)

    @app.task(name="forever")
    def forever(ctx: leaseq.JobContext, payload: Any) -> None:
        ctx.wait_for("never")

    job_id, by_sql = client.enqueue("forever"), client.enqueue("forever")
    worker = leaseq.Worker(app, _config(drain=False))
    run = asyncio.create_task(worker.run())
    for j in (job_id, by_sql):
        await _until(lambda j=j: _status(client, j) is JobStatus.SUSPENDED, "the wait")
    # Counted for status and metrics: two waits for a signal, none overdue (no timeout).
    assert client.database_health()["suspended"] == [("default", "signal", 2, 0.0)]
    exposition = generate_latest(database_registry(lambda: ([], client.database_health())))
    assert b'leaseq_jobs_suspended{queue="default",reason="signal"} 2.0' in exposition
    assert b'leaseq_suspended_wakeup_overdue_seconds{queue="default"} 0.0' in exposition
    # The SQL API's cancel (migration 25 refreshed its copy) ends it at once too.
    assert rows(dsn, "SELECT {s}.cancel(%s, 'sql', 'no')", schema, by_sql) == [(True,)]
    assert _status(client, by_sql) is JobStatus.CANCELLED
    assert rows(dsn, "SELECT wake_at = 'infinity' FROM {s}.jobs WHERE id = %s", schema, job_id)[
        0
    ] == (True,)
    assert client.cancel(job_id, actor="ops", reason="not needed")
    worker.stop()
    await asyncio.wait_for(run, 30)
    ((status, wake_at),) = rows(
        dsn, "SELECT status::text, wake_at FROM {s}.jobs WHERE id = %s", schema, job_id
    )
    assert (status, wake_at) == ("cancelled", None)
    assert _trail(dsn, schema, job_id)[-1][:3] == ("cancelled", "suspended", "cancelled")
    assert not client.signal(job_id, "never")


async def test_a_job_with_an_ordering_key_cannot_suspend(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    app = _app(dsn, schema)

    @app.task(name="keyed")
    def keyed(ctx: leaseq.JobContext, payload: Any) -> None:
        if payload["how"] == "sleep":
            ctx.sleep(1)
        elif payload["how"] == "wait":
            ctx.wait_for("go", timeout=60)
        else:
            ctx.gather([ctx.spawn("keyed", {"how": "none"})])

    ids = {
        how: client.enqueue("keyed", {"how": how}, ordering_key=f"acct-{how}")
        for how in ("sleep", "wait", "gather")
    }
    behind = client.enqueue("keyed", {"how": "none"}, ordering_key="acct-sleep")
    worker = leaseq.Worker(app, _config(drain=False))
    run = asyncio.create_task(worker.run())
    await _until(
        lambda: all(_status(client, i) is JobStatus.DEAD for i in ids.values()), "three dead"
    )
    worker.stop()
    await asyncio.wait_for(run, 30)
    for job_id in ids.values():
        job = client.get_job(job_id)
        assert job is not None and job.status is JobStatus.DEAD, job
        # Dead at once, with a code: no retry could ever suspend it.
        assert (job.attempt_count, job.last_error_code) == (1, "SUSPEND_REFUSED"), job
        assert "ordering key cannot" in (job.last_error_detail or ""), job
    # The key's order holds: the job behind the dead head waits for a replay or a skip.
    assert _status(client, behind) is JobStatus.PENDING
    assert rows(dsn, "SELECT blocked FROM {s}.jobs WHERE id = %s", schema, behind) == [(True,)]


async def test_the_approval_flow_of_docs_durable_runs_as_pasted(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    page = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "durable.md").read_text()
    block = page.split("```python\n")[2].split("```", 1)[0]
    block = block.replace("app = leaseq.App()", "")  # the test's app, on its schema
    app = _app(dsn, schema)
    namespace: dict[str, Any] = {"app": app, "__name__": "docs_durable"}
    exec(compile(block, "docs/durable.md", "exec"), namespace)
    yes, no = client.enqueue("refund", {"order": 1}), client.enqueue("refund", {"order": 2})
    worker = leaseq.Worker(app, _config(drain=False))
    run = asyncio.create_task(worker.run())
    for job_id in (yes, no):
        await _until(lambda j=job_id: _status(client, j) is JobStatus.SUSPENDED, "the wait")
    assert namespace["approve"](client, yes, "ada")
    assert client.signal(no, "approval", {"approved": False, "by": "bob"})
    for job_id in (yes, no):  # the worker runs on this loop: no blocking wait for a result
        await _until(lambda j=job_id: _status(client, j) is JobStatus.SUCCEEDED, "the end")
    worker.stop()
    await asyncio.wait_for(run, 30)
    assert client.result(yes, timeout=5) == "ticket-1: refunded, approved by ada"
    assert client.result(no, timeout=5) == "ticket-2: refused by bob"


async def test_two_waits_for_one_name_each_consume_one_delivery_in_order(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    app = _app(dsn, schema)
    runs: list[int] = []

    @app.task(name="twice", store_result=True)
    def twice(ctx: leaseq.JobContext, payload: Any) -> Any:
        runs.append(ctx.attempt)
        first = ctx.wait_for("approve", timeout=60)
        ctx.step("between", lambda: None)
        try:
            ctx.wait_for("approve", timeout=0.2)  # times out: consumes nothing
            timed_out = False
        except leaseq.WaitTimeout:
            timed_out = True
        second = ctx.wait_for("approve", timeout=60)
        return [first, timed_out, second]

    buffered = client.enqueue("twice")
    assert client.signal(buffered, "approve", 1)
    late = client.enqueue("twice")
    assert client.signal(late, "approve", "a")
    worker = leaseq.Worker(app, _config(drain=False))
    run = asyncio.create_task(worker.run())
    await _until(lambda: _status(client, late) is JobStatus.SUSPENDED, "the timed wait")
    await _until(
        lambda: (
            _status(client, late) is JobStatus.SUSPENDED
            and "wait:approve/3" in [r.name for r in client.step_records(late)]
        ),
        "the third wait to suspend",
    )
    assert client.signal(late, "approve", "b")  # wakes the third wait
    assert client.signal(buffered, "approve", 2)
    await _until(lambda: _status(client, late) is JobStatus.SUCCEEDED, "the late job")
    await _until(lambda: _status(client, buffered) is JobStatus.SUCCEEDED, "the buffered job")
    worker.stop()
    await asyncio.wait_for(run, 30)
    assert client.result(late, timeout=5) == ["a", True, "b"]
    assert client.result(buffered, timeout=5) == [1, True, 2]
    records = [(r.name, r.result or {}) for r in client.step_records(late)]
    names = [(n, v.get("payload"), v.get("seq")) for n, v in records]
    assert names == [
        ("wait:approve", "a", 1),
        ("between", None, None),
        ("wait:approve/2", None, None),
        ("wait:approve/3", "b", 2),
    ]
    sent = rows(dsn, "SELECT seq FROM {s}.job_signals WHERE job_id = %s ORDER BY seq", schema, late)
    assert sent == [(1,), (2,)]
