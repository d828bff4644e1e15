"""Issue 28's six reproduced invariant breaks, each at its boundary: a statement of one
path paused (a transaction holding a lock, or the client stopped between two of its
statements) while another path commits, then the invariant checked on the rows. Each test
failed before its fix (checked by reverting the fix once)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from typing import Any

import psycopg
import pytest
from psycopg import sql

import leaseq
from leaseq import JobStatus
from leaseq.worker.completer import Completer
from tests.support.helpers import (
    expire_lease,
    make_available,
    rows,
    run_sql,
)
from tests.support.pausing import PausingClient
from tests.support.procs import wait_for


def _live(dsn: str, schema: str, key: str) -> list[int]:
    found = rows(
        dsn,
        "SELECT id FROM {s}.jobs WHERE unique_key = %s AND status IN ('pending', 'running')"
        " ORDER BY id",
        schema,
        key,
    )
    return [int(r[0]) for r in found]


# -- 1: release of a superseded job -------------------------------------------------------


def test_release_of_a_superseded_job_does_not_revive_it_beside_its_follow_up(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    """A claimed keyed job, a replace that queues a follow-up while it runs, then the
    worker shuts down and gives the unstarted lease back: the follow-up alone holds the
    key live; the released holder ends cancelled (SUPERSEDED), its old payload never runs."""
    holder = client.enqueue("t", {"v": 1}, unique_key="k1", on_conflict="replace")
    (lease,) = client.claim(worker="w")
    follow_up = client.enqueue("t", {"v": 2}, unique_key="k1", on_conflict="replace")
    assert follow_up != holder
    assert client.release(lease)
    assert _live(dsn, schema, "k1") == [follow_up]
    job = client.get_job(holder)
    assert job is not None and job.status is JobStatus.CANCELLED
    assert job.last_error_code == "SUPERSEDED"
    assert [(e.event, e.to_status) for e in client.job_events(holder)][-1] == (
        "released",
        JobStatus.CANCELLED,
    )
    # What is claimed next is the follow-up with the new payload, and nothing else.
    claimed = client.claim(worker="w", limit=10)
    assert [(x.job_id, x.payload) for x in claimed] == [(follow_up, {"v": 2})]


def test_release_of_a_job_that_kept_its_key_gives_it_back(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    holder = client.enqueue("t", unique_key="k1")
    (lease,) = client.claim(worker="w")
    assert client.release(lease)
    assert _live(dsn, schema, "k1") == [holder]
    job = client.get_job(holder)
    assert job is not None and job.status is JobStatus.PENDING and job.attempt_count == 0


# -- 2: a follow-up racing the holder's retry ----------------------------------------------


@pytest.mark.parametrize("how", ["retry", "sweep", "release"])
def test_follow_up_racing_the_holders_retry_leaves_one_live_job(
    dsn: str, schema: str, client: leaseq.Client, how: str
) -> None:
    """The enqueue read the holder as running (unique_holder) and is stopped there; the
    holder's retry (a failure, the sweeper's requeue, a release) commits; the enqueue goes
    on. Before the fix insert_follow_up moved the key to a new job while the holder was
    pending again: two live jobs with one key. Now the enqueue replaces the pending
    holder's payload instead."""
    holder = client.enqueue("t", {"v": 1}, unique_key="k2", on_conflict="replace")
    (lease,) = client.claim(worker="w")
    enqueuer = PausingClient(dsn, schema=schema, pause_after="unique_holder")
    result: list[int] = []
    thread = threading.Thread(
        target=lambda: result.append(
            enqueuer.enqueue("t", {"v": 2}, unique_key="k2", on_conflict="replace")
        )
    )
    try:
        thread.start()
        assert enqueuer.reached.wait(30)
        if how == "retry":
            assert client.fail(lease, "BOOM", retryable=True)
        elif how == "sweep":
            rows(
                dsn,
                "UPDATE {s}.jobs SET lease_expires_at = now() - interval '1 second'"
                " WHERE id = %s RETURNING id",
                schema,
                holder,
            )
            assert client.sweep().requeued == 1
        else:
            assert client.release(lease)
        enqueuer.go.set()
        thread.join(30)
        assert not thread.is_alive()
    finally:
        enqueuer.go.set()
        enqueuer.close()
    assert _live(dsn, schema, "k2") == [holder]
    assert result == [holder]
    job = client.get_job(holder)
    assert job is not None and job.status is JobStatus.PENDING and job.payload == {"v": 2}


# -- 6: a stale and a current lease of one job in one completion batch --------------------


def _stale_and_current(dsn: str, schema: str, client: leaseq.Client) -> tuple[Any, Any]:
    """A lease that expired and was swept (stale) and the job's next lease (current)."""
    client.enqueue("t")
    (stale,) = client.claim(worker="w")
    expire_lease(dsn, schema, stale.job_id)
    assert client.sweep().requeued == 1
    make_available(dsn, schema)
    (current,) = client.claim(worker="w")
    assert current.job_id == stale.job_id and current.token == stale.token + 1
    return stale, current


def test_stale_and_current_lease_in_one_batch_store_the_current_result(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    """Before the fix the stored results were matched by job id: the job went into
    store_results twice, the upsert raised CardinalityViolation and the current lease's
    completion rolled back with it."""
    # The job-id keyed form with both leases: one completion, one value, no error.
    other_stale, other = _stale_and_current(dsn, schema, client)
    assert client.complete_many([other_stale, other], results={other.job_id: ("7", 60.0)}) == {
        other.job_id
    }
    assert client.result(other.job_id, timeout=0) == 7
    # By lease: each lease its own value, and only the current one's is stored.
    stale, current = _stale_and_current(dsn, schema, client)
    results = {
        (stale.job_id, stale.token): ('"stale"', 60.0),
        (current.job_id, current.token): ('"current"', 60.0),
    }
    done = client.complete_leases([stale, current], results=results)
    assert done == {(current.job_id, current.token)}
    assert client.result(current.job_id, timeout=0) == "current"


async def test_completer_reports_the_stale_lease_lost_and_survives_a_refused_write(
    dsn: str, schema: str, client: leaseq.Client, aclient: leaseq.AsyncClient
) -> None:
    """The worker's completion task: the stale attempt is reported lost (None), not
    succeeded; a write the database refuses (a result that is not JSON) costs only its own
    lease, and the task goes on completing later work."""
    stale, current = _stale_and_current(dsn, schema, client)
    client.enqueue("t")
    (bad,) = client.claim(worker="w")
    completer = Completer(aclient)
    task = asyncio.create_task(completer.run())
    seen: dict[tuple[int, int], JobStatus | None] = {}

    def submit(lease: Any, result: tuple[str, float] | None) -> asyncio.Event:
        event = asyncio.Event()

        def done(status: JobStatus | None) -> None:
            seen[lease.job_id, lease.token] = status
            event.set()

        completer.submit(lease, deadline=time.monotonic() + 60, on_done=done, result=result)
        return event

    try:
        events = [
            submit(stale, ('"stale"', 60.0)),
            submit(current, ('"current"', 60.0)),
            submit(bad, ("{not json", 60.0)),
        ]
        for event in events:
            await asyncio.wait_for(event.wait(), 30)
        assert seen[stale.job_id, stale.token] is None
        assert seen[current.job_id, current.token] is JobStatus.SUCCEEDED
        assert seen[bad.job_id, bad.token] is None
        assert not task.done()
        client.enqueue("t")
        (later,) = client.claim(worker="w")
        await asyncio.wait_for(submit(later, ("1", 60.0)).wait(), 30)
        assert seen[later.job_id, later.token] is JobStatus.SUCCEEDED
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert client.result(current.job_id, timeout=0) == "current"
    job = client.get_job(bad.job_id)
    assert job is not None and job.status is JobStatus.RUNNING  # left to its lease's expiry


# -- 5: slot rows reported by admit() itself -------------------------------------------------


def _admit_waits(dsn: str, schema: str) -> bool:
    """claim_limited_jobs is waiting for a lock (pg_stat_activity shows the outer statement,
    its first kilobyte: the pick CTE and the schema name are in it)."""
    ((n,),) = rows(
        dsn,
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
        " AND query LIKE %s AND query LIKE '%%pick AS MATERIALIZED%%'",
        schema,
        f"%{schema}%",
    )
    return int(n) > 0


def test_a_task_limit_created_during_a_claim_leaves_no_slot_row_behind(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    """The claim statement's snapshot sees no task limit; admit() (newer snapshots, one per
    chunk) does, and takes a slot row for the second chunk's job. The claim is held inside
    admit() by a transaction holding the queue's rate bucket, while the task limit is
    created and committed. Before the fix Lease.slot_rows came from the claim's snapshot
    (false): the plain completion left the slot row behind, and a task limit lowered to 1
    then admitted nothing."""
    client.set_limit("queue:default", rate=leaseq.RateLimit(1000, burst=100))
    first, second, third = (client.enqueue("t") for _ in range(3))
    run_sql(
        dsn,
        "INSERT INTO {s}.rate_buckets (limit_name, tat) VALUES ('queue:default', now())",
        schema,
    )
    skip = psycopg.connect(dsn)  # the first candidate, locked: admit() skips it (chunk 1)
    bucket = psycopg.connect(dsn)  # the bucket: admit() waits for it inside chunk 1
    claimer = leaseq.Client(dsn, schema=schema)
    got: list[list[Any]] = []
    thread = threading.Thread(target=lambda: got.append(claimer.claim(worker="w", limit=2)))
    try:
        skip.execute(
            sql.SQL("SELECT id FROM {}.jobs WHERE id = %s FOR UPDATE").format(
                sql.Identifier(schema)
            ),
            (first,),
        )
        bucket.execute(
            sql.SQL("SELECT tat FROM {}.rate_buckets FOR UPDATE").format(sql.Identifier(schema))
        )
        thread.start()
        wait_for(lambda: _admit_waits(dsn, schema), 30, "the claim waiting inside admit()")
        client.set_limit("task:t", concurrency=5)  # committed while the claim is held
        bucket.commit()
        thread.join(30)
        assert not thread.is_alive()
    finally:
        bucket.close()
        skip.close()
        claimer.close()
    (leases,) = got
    assert sorted(x.job_id for x in leases) == [second, third]
    ((held,),) = rows(dsn, "SELECT count(*) FROM {s}.limit_slots", schema)
    assert held == 1  # admit() took the task limit's slot for the second chunk's job
    for lease in leases:
        assert client.complete(lease)
    assert rows(dsn, "SELECT job_id, slot FROM {s}.limit_slots", schema) == []
    # The task limit lowered to 1: with a slot row left behind it admitted nothing.
    client.set_limit("task:t", concurrency=1)
    assert [x.job_id for x in client.claim(worker="w", limit=5)] == [first]


# -- 4: retention and purge while a batch is unfinished ---------------------------------------


def _callbacks(dsn: str, schema: str) -> list[tuple[Any, ...]]:
    return rows(
        dsn,
        "SELECT kind, (SELECT task FROM {s}.jobs WHERE id = job_id) FROM {s}.batch_callbacks",
        schema,
    )


def _age_finished(dsn: str, schema: str) -> None:
    """Retention's cut-off passed for every finished job (finished an hour ago)."""
    run_sql(
        dsn,
        "UPDATE {s}.jobs SET finished_at = now() - interval '1 hour' WHERE finished_at IS NOT NULL",
        schema,
    )


@pytest.mark.parametrize("ending", ["cancelled", "dead"])
def test_a_batch_outliving_retention_fires_the_right_callback(
    dsn: str, schema: str, client: leaseq.Client, ending: str
) -> None:
    """A member ends cancelled (or dead) while another still runs; retention (or a purge
    of dead jobs) runs before the batch fires. Before the fix the ended member's row was
    deleted, fire_batches counted the rows left, and the batch fired on_success with a
    smaller total instead of on_failure."""
    with client.batch(on_success=leaseq.Sig("report"), on_failure=leaseq.Sig("alert")) as b:
        first, second = (int(i) for i in b.enqueue_many([{"task": "t"}, {"task": "t"}]))
    if ending == "cancelled":
        assert client.cancel(first)
    (lease,) = client.claim(worker="w")
    if ending == "dead":
        assert lease.job_id == first
        assert client.fail(lease, "BOOM", retryable=False)
        (lease,) = client.claim(worker="w")
    assert lease.job_id == second
    _age_finished(dsn, schema)
    pruned = client.prune(older_than=60)
    purged = client.purge_dead(reason="cleanup", actor="test")
    assert client.complete(lease)
    assert _callbacks(dsn, schema) == [("failure", "alert")]
    assert (pruned, purged) == (0, 0) and client.get_job(first) is not None
    (callback,) = client.claim(worker="w")
    assert callback.payload["total"] == 2 and callback.payload["succeeded"] == 1
    # Once the batch fired, its members go with retention as any job does.
    assert client.complete(callback)
    _age_finished(dsn, schema)
    assert client.prune(older_than=60) >= 2


async def test_completer_keeps_a_stale_and_a_current_failure_of_one_job_apart(
    dsn: str, schema: str, client: leaseq.Client, aclient: leaseq.AsyncClient
) -> None:
    """As for completions: the stale failure is reported lost, the current one with the
    job's new status."""
    stale, current = _stale_and_current(dsn, schema, client)
    completer = Completer(aclient)
    task = asyncio.create_task(completer.run())
    seen: dict[int, JobStatus | None] = {}
    events = []
    try:
        for lease in (stale, current):
            event = asyncio.Event()
            events.append(event)

            def done(status: JobStatus | None, token: int = lease.token, ev: Any = event) -> None:
                seen[token] = status
                ev.set()

            failure = leaseq.Failure(lease, "BOOM")
            completer.submit(failure, deadline=time.monotonic() + 60, on_done=done)
        for event in events:
            await asyncio.wait_for(event.wait(), 30)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert seen == {stale.token: None, current.token: JobStatus.PENDING}
