"""Durable pauses against a real PostgreSQL: the claim statement itself refuses a paused
queue, task or ordering key; the barrier makes a pause hold from its commit (no claim
commits after it); a pause in the caller's transaction holds only if that commits; resume
wakes listeners; every pause and resume is audited; bad input stores nothing."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from psycopg import sql

import leaseq
from leaseq import ConfigError, JobStatus
from leaseq.db_metrics import database_registry
from leaseq.rules.pauses import SCOPES
from leaseq.worker.listener import LISTENER_APPLICATION_NAME
from tests.support.helpers import rows


def _in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    thread.start()
    return thread, out


def _waiting_on_lock(dsn: str, application_name: str) -> bool:
    with psycopg.connect(dsn, autocommit=True) as conn:
        found = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s "
            "AND wait_event_type = 'Lock'",
            (application_name,),
        ).fetchone()
    return bool(found and found[0])


def _wait_until(condition: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def test_queue_pause_stops_claims_until_resume_and_other_queues_flow(
    client: leaseq.Client,
) -> None:
    # A pause on a queue that has no jobs yet is valid and applies when they arrive.
    assert client.pause("mail", reason="smtp outage", actor="ops")
    mail = client.enqueue("send", queue="mail")
    other = client.enqueue("send", queue="default")
    assert client.claim("mail", worker="w", limit=10) == []
    assert [x.job_id for x in client.claim("default", worker="w")] == [other]

    assert client.resume("mail", actor="ops", reason="smtp back")
    assert [x.job_id for x in client.claim("mail", worker="w")] == [mail]
    assert client.resume("mail") is False, "nothing left to resume"


def test_task_pause_leaves_other_tasks_of_the_queue_flowing(client: leaseq.Client) -> None:
    client.pause(task="resize", reason="bad release")
    paused = client.enqueue("resize", priority=10)
    free = client.enqueue("thumbnail")
    assert [x.job_id for x in client.claim(worker="w", limit=10)] == [free]
    client.resume(task="resize")
    assert [x.job_id for x in client.claim(worker="w", limit=10)] == [paused]


def test_ordering_key_pause_leaves_other_keys_and_unkeyed_jobs_flowing(
    client: leaseq.Client,
) -> None:
    client.pause(ordering_key="acct-1", reason="customer asked")
    held = client.enqueue("t", ordering_key="acct-1", priority=10)
    other_key = client.enqueue("t", ordering_key="acct-2")
    unkeyed = client.enqueue("t")
    claimed = {x.job_id for x in client.claim(worker="w", limit=10)}
    assert claimed == {other_key, unkeyed}
    client.resume(ordering_key="acct-1")
    assert [x.job_id for x in client.claim(worker="w", limit=10)] == [held]


def test_pause_and_resume_are_audited_and_listed(client: leaseq.Client) -> None:
    assert client.pause("q1", reason="first", actor="alice")
    assert client.pause("q1", reason="second", actor="bob") is False, "kept as it was"
    client.pause(task="t1", reason="why not")
    listed = client.pauses()
    assert [(p.scope, p.value, p.paused_by, p.reason) for p in listed] == [
        ("queue", "q1", "alice", "first"),
        ("task", "t1", None, "why not"),
    ]
    client.resume("q1", actor="carol", reason="fixed")
    events = client.admin_events()
    assert [(e.action, e.scope, e.value, e.actor, e.reason) for e in reversed(events)] == [
        ("pause", "queue", "q1", "alice", "first"),
        ("pause", "task", "t1", None, "why not"),
        ("resume", "queue", "q1", "carol", "fixed"),
    ]
    assert events[0].detail and events[0].detail.startswith("paused for")
    assert [p.scope for p in client.pauses()] == ["task"]


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        ((), {"reason": "x"}, "exactly one scope"),
        (("q",), {"task": "t", "reason": "x"}, "exactly one scope"),
        (("q",), {"reason": "  "}, "needs a reason"),
        (("bad name",), {"reason": "x"}, "invalid queue name"),
        ((), {"task": "", "reason": "x"}, "task name"),
        ((), {"ordering_key": "k" * 201, "reason": "x"}, "ordering_key"),
        (("q",), {"reason": "x", "actor": "a" * 201}, "actor"),
    ],
)
def test_bad_pause_input_is_one_line_and_stores_nothing(
    client: leaseq.Client, args: tuple[Any, ...], kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        client.pause(*args, **kwargs)
    assert "\n" not in str(info.value)
    assert client.pauses() == [] and client.admin_events() == []


def test_cancel_running_asks_running_jobs_in_scope_to_stop(client: leaseq.Client) -> None:
    in_scope = client.enqueue("t", queue="q")
    out_of_scope = client.enqueue("t", queue="other")
    (a,) = client.claim("q", worker="w")
    (b,) = client.claim("other", worker="w")
    client.pause("q", reason="stop it", actor="ops", cancel_running=True)
    beat = client.heartbeat_many([a, b])
    assert beat.cancel_requested == {in_scope}, "the cancel path: seen at the next heartbeat"
    assert set(beat.renewed) == {in_scope, out_of_scope}, "leases stay valid"
    events = client.job_events(in_scope)
    assert [(e.event, e.actor, e.detail) for e in events][-1] == (
        "cancel_requested",
        "ops",
        "stop it",
    )
    assert client.job_events(out_of_scope) == []
    assert client.fail(a, "STOPPED")
    job = client.get_job(in_scope)
    assert job is not None and job.status is JobStatus.CANCELLED


@pytest.mark.parametrize("prepared", [False, True])
def test_pause_waits_for_a_claim_in_flight_and_is_stamped_after_it(
    client: leaseq.Client, dsn: str, schema: str, prepared: bool
) -> None:
    """The barrier: a claim statement that began before the pause commits first, and the
    pause's paused_at is later than that claim's start; none can commit after it. Also with
    a cached plan (prepared statement), which takes the plan's locks again at each run."""
    job_id = client.enqueue("t", queue="q")
    later = client.enqueue("t", queue="q")
    params = {"queue": "q", "owner": "w", "lease_seconds": 60.0, "limit": 1}
    claim = client.queries["claim_jobs"]
    with psycopg.connect(dsn) as claimer:  # a claim transaction still open
        if prepared:
            for _ in range(3):
                claimer.execute(claim, {**params, "queue": "empty"}, prepare=True)
            claimer.commit()
        got = claimer.execute(claim, params, prepare=prepared).fetchall()
        assert [r[0] for r in got] == [job_id]
        pauser = leaseq.Client(dsn, schema=schema, application_name="pauser")
        try:
            thread, _ = _in_thread(lambda: pauser.pause("q", reason="barrier"))
            _wait_until(lambda: _waiting_on_lock(dsn, "pauser"), "the pause to wait")
            assert client.pauses() == [], "not in force while it waits"
            claimer.commit()
            thread.join(10)
            assert not thread.is_alive()
        finally:
            pauser.close()
    ((started, paused_at),) = rows(
        dsn,
        "SELECT j.started_at, p.paused_at FROM {s}.jobs j, {s}.pauses p WHERE j.id = %s",
        schema,
        job_id,
    )
    assert paused_at > started
    assert client.claim("q", worker="w") == []
    client.resume("q")
    assert [x.job_id for x in client.claim("q", worker="w")] == [later]


@pytest.mark.parametrize("prepared", [False, True])
def test_pause_in_callers_transaction_holds_only_from_its_commit(
    client: leaseq.Client, dsn: str, schema: str, prepared: bool
) -> None:
    """Also the barrier's other side: a claim arriving while the pause is uncommitted waits
    for it, then sees the outcome (with a cached plan too)."""
    first = client.enqueue("t", queue="q")
    claimer = leaseq.Client(dsn, schema=schema, application_name="claimer", pool_size=1)
    try:
        if prepared:  # psycopg prepares a statement on its sixth run
            for _ in range(6):
                assert claimer.claim("empty", worker="w") == []
        # Rolled back: never in force. The claim waits for the transaction, then claims.
        with client.connection() as conn:
            with conn.transaction(force_rollback=True):
                client.pause("q", reason="maybe", connection=conn)
                thread, got = _in_thread(lambda: claimer.claim("q", worker="w"))
                _wait_until(lambda: _waiting_on_lock(dsn, "claimer"), "the claim to wait")
            thread.join(10)
        assert [x.job_id for x in got[0]] == [first]
        assert client.pauses() == [] and client.admin_events() == []

        # Committed: a claim waiting on it claims nothing.
        client.enqueue("t", queue="q")
        with client.connection() as conn:
            with conn.transaction():
                client.pause("q", reason="for real", connection=conn)
                thread, got = _in_thread(lambda: claimer.claim("q", worker="w"))
                _wait_until(lambda: _waiting_on_lock(dsn, "claimer"), "the claim to wait")
            thread.join(10)
        assert got == [[]]
        assert [p.reason for p in client.pauses()] == ["for real"]
    finally:
        claimer.close()


def test_resume_notifies_the_queue_or_everyone(client: leaseq.Client, dsn: str) -> None:
    client.pause("q", reason="r")
    client.pause(task="t", reason="r")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(client.channel)))
        client.resume("q")
        client.resume(task="t")
        payloads = [n.payload for n in conn.notifies(timeout=5, stop_after=2)]
    assert payloads == ["q", "*"]


def test_pause_gauges_count_pauses_by_scope_and_mark_paused_queues(
    client: leaseq.Client,
) -> None:
    def fetch() -> tuple[list[leaseq.QueueStats], dict[str, Any]]:
        return client.queue_stats(), {**client.database_health(), "pauses": client.pauses()}

    registry = database_registry(fetch)
    assert registry.get_sample_value("leaseq_pauses", {"scope": "queue"}) == 0
    client.pause("q", reason="r")
    client.pause(task="t", reason="r")
    client.pause(task="u", reason="r")
    got = {s: registry.get_sample_value("leaseq_pauses", {"scope": s}) for s in SCOPES}
    assert got == {"queue": 1, "task": 2, "ordering_key": 0}
    assert registry.get_sample_value("leaseq_queue_paused", {"queue": "q"}) == 1
    assert registry.get_sample_value("leaseq_queue_paused", {"queue": "other"}) is None
    age = registry.get_sample_value("leaseq_oldest_pause_age_seconds", {"scope": "task"})
    assert age is not None and age >= 0
    none = {"scope": "ordering_key"}
    assert registry.get_sample_value("leaseq_oldest_pause_age_seconds", none) == 0


async def test_resuming_a_task_wakes_an_idle_worker_at_once(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    """A task's resume is a wake-up for every listener ("*"): a worker that polls only once
    an hour runs the released job at once."""
    app = leaseq.App(dsn, schema=schema)
    ran = asyncio.Event()

    @app.task(name="held")
    async def held(ctx: leaseq.JobContext, payload: Any) -> None:
        ran.set()

    client.pause(task="held", reason="r")
    client.enqueue("held")
    worker = leaseq.Worker(app, leaseq.WorkerConfig(poll_interval=3600, lease_seconds=30))
    run = asyncio.create_task(worker.run())
    try:

        def listening() -> bool:
            found = rows(
                dsn,
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s "
                "AND query LIKE %s AND state = 'idle'",
                schema,
                LISTENER_APPLICATION_NAME,
                f"LISTEN %{client.channel}%",
            )
            return bool(found[0][0])

        for _ in range(500):
            if listening():
                break
            await asyncio.sleep(0.02)
        assert listening()
        await asyncio.sleep(0.2)  # the wake-up of the listener's connect claims nothing
        assert not ran.is_set()
        await asyncio.to_thread(client.resume, task="held")
        await asyncio.wait_for(ran.wait(), 10)
    finally:
        worker.stop()
        await asyncio.wait_for(run, 10)


def test_pause_on_a_connection_outside_a_transaction_commits_itself(
    client: leaseq.Client, dsn: str
) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert client.pause("q", reason="r", connection=conn)
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    assert [p.value for p in client.pauses()] == ["q"]
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert client.resume("q", connection=conn)
    assert client.pauses() == []


async def test_async_client_pauses_and_resumes(aclient: leaseq.AsyncClient) -> None:
    assert await aclient.pause(task="t", reason="r", actor="a")
    await aclient.enqueue("t")
    assert await aclient.claim(worker="w") == []
    assert [(p.scope, p.value) for p in await aclient.pauses()] == [("task", "t")]
    assert await aclient.resume(task="t", actor="a")
    assert len(await aclient.claim(worker="w")) == 1
    assert [e.action for e in await aclient.admin_events()] == ["resume", "pause"]
