"""A stored row that no leaseq call would write (by hand-written SQL, a bug, an older
version) costs only its own job: the claim of its batch succeeds, the row ends dead with its
reason, and inspection shows it instead of raising.

Each test breaks one row of a queue that also holds good jobs, then claims the batch.
"""

from __future__ import annotations

import datetime as dt
import sys

import pytest

import leaseq
from leaseq import JobStatus
from leaseq.codes import ErrorCode
from leaseq.owners import worker_of
from tests.support.helpers import expire_lease, rows, run_sql

#: Deeper than Python's JSON decoder can go from any call stack (PostgreSQL stores it).
DEEP = sys.getrecursionlimit() + 10

BAD_ROWS = {
    "available_at_minus_infinity": (
        "UPDATE {s}.jobs SET available_at = '-infinity' WHERE id = %s",
        ErrorCode.ROW_OUT_OF_RANGE,
    ),
    "lease_token_at_bigint_max": (
        "UPDATE {s}.jobs SET lease_token = 9223372036854775807 WHERE id = %s",
        ErrorCode.ROW_OUT_OF_RANGE,
    ),
    "attempt_count_at_int_max": (
        "UPDATE {s}.jobs SET attempt_count = 2147483647 WHERE id = %s",
        ErrorCode.ROW_OUT_OF_RANGE,
    ),
    "created_at_infinity": (
        "UPDATE {s}.jobs SET created_at = 'infinity' WHERE id = %s",
        ErrorCode.ROW_OUT_OF_RANGE,
    ),
    "created_at_beyond_python": (
        "UPDATE {s}.jobs SET created_at = '20000-01-01' WHERE id = %s",
        ErrorCode.ROW_OUT_OF_RANGE,
    ),
    "payload_nested_too_deep": (
        f"UPDATE {{s}}.jobs SET payload = (repeat('[', {DEEP}) || repeat(']', {DEEP}))::jsonb "
        "WHERE id = %s",
        ErrorCode.INVALID_PAYLOAD,
    ),
}


def _queue_with_one_bad_row(
    client: leaseq.Client, dsn: str, schema: str, breaking: str, **job: object
) -> tuple[list[int], int]:
    good = client.enqueue_many([{"task": "t", "payload": {"i": i}} for i in range(3)])
    bad = client.enqueue("t", {"bad": True}, **job)  # type: ignore[arg-type]
    good += client.enqueue_many([{"task": "t", "payload": {"i": i}} for i in range(3, 5)])
    run_sql(dsn, breaking, schema, bad)
    return good, bad


@pytest.mark.parametrize("case", sorted(BAD_ROWS))
def test_one_bad_row_costs_only_its_own_job(
    client: leaseq.Client, dsn: str, schema: str, case: str
) -> None:
    breaking, code = BAD_ROWS[case]
    good, bad = _queue_with_one_bad_row(client, dsn, schema, breaking)
    # Before the claim, inspection shows the row instead of raising.
    assert client.get_job(bad) is not None
    assert bad in {j.job_id for j in client.list_jobs("pending", limit=100)}

    leases = client.claim(worker="w", limit=10)

    assert sorted(lease.job_id for lease in leases) == good
    assert all(lease.payload["i"] >= 0 for lease in leases)
    job = client.get_job(bad)
    assert job is not None and job.status is JobStatus.DEAD
    assert job.last_error_code == code and job.last_error_class == "permanent"
    assert job.lease_owner is None
    (event,) = [e for e in client.job_events(bad) if e.event == "dead"]
    assert event.actor is not None and worker_of(event.actor) == "w"
    assert event.detail and event.detail.startswith("cannot be claimed")
    assert [j.job_id for j in client.list_jobs("dead")] == [bad]
    # The good leases are intact: each completes under its fence.
    assert client.complete_many(leases) == set(good)
    assert client.claim(worker="w", limit=10) == []


def test_an_undecodable_payload_is_shown_not_raised(
    client: leaseq.Client, dsn: str, schema: str
) -> None:
    breaking, _ = BAD_ROWS["payload_nested_too_deep"]
    _, bad = _queue_with_one_bad_row(client, dsn, schema, breaking)
    job = client.get_job(bad)
    assert job is not None and job.payload is None
    assert job.unreadable and "RecursionError" in job.unreadable
    assert job.as_dict()["unreadable"] == job.unreadable
    good = client.get_job(bad - 1)
    assert good is not None and good.unreadable is None and good.payload == {"i": 2}


def test_infinite_times_are_shown_as_the_nearest_datetime(
    client: leaseq.Client, dsn: str, schema: str
) -> None:
    job_id = client.enqueue("t")
    run_sql(
        dsn,
        "UPDATE {s}.jobs SET available_at = '-infinity', created_at = 'infinity' WHERE id = %s",
        schema,
        job_id,
    )
    job = client.get_job(job_id)
    assert job is not None
    assert job.available_at == dt.datetime.min.replace(tzinfo=dt.UTC)
    assert job.created_at == dt.datetime.max.replace(tzinfo=dt.UTC)


def test_a_bad_keyed_row_releases_its_key_under_skip(
    client: leaseq.Client, dsn: str, schema: str
) -> None:
    """Ending the row dead goes through the ordering-key protocol: under ``skip`` the next
    job of its key becomes claimable."""
    head = client.enqueue("t", ordering_key="k", key_policy="skip")
    second = client.enqueue("t", {"n": 2}, ordering_key="k")
    run_sql(
        dsn, "UPDATE {s}.jobs SET lease_token = 9223372036854775807 WHERE id = %s", schema, head
    )
    assert client.claim(worker="w", limit=10) == []
    head_job = client.get_job(head)
    assert head_job is not None and head_job.status is JobStatus.DEAD
    (lease,) = client.claim(worker="w", limit=10)
    assert lease.job_id == second


def test_the_sweep_and_priority_aging_pass_over_infinite_times(
    client: leaseq.Client, dsn: str, schema: str
) -> None:
    running = client.enqueue("t")
    (lease,) = client.claim(worker="w")
    assert lease.job_id == running
    run_sql(dsn, "UPDATE {s}.jobs SET created_at = '-infinity' WHERE id = %s", schema, running)
    expire_lease(dsn, schema, running)
    assert client.sweep().requeued == 1

    waiting = client.enqueue("t")
    run_sql(dsn, "UPDATE {s}.jobs SET available_at = '-infinity' WHERE id = %s", schema, waiting)
    old = client.enqueue("t")
    run_sql(dsn, "UPDATE {s}.jobs SET available_at = '0001-01-01' WHERE id = %s", schema, old)
    assert client.age_priorities(interval=1.0) == 1
    ((priority,),) = rows(dsn, "SELECT priority FROM {s}.jobs WHERE id = %s", schema, old)
    assert priority == 32767


async def test_the_async_claim_ends_a_bad_row_dead(
    aclient: leaseq.AsyncClient, dsn: str, schema: str
) -> None:
    good = await aclient.enqueue("t", {"i": 0})
    bad = await aclient.enqueue("t")
    breaking, code = BAD_ROWS["payload_nested_too_deep"]
    run_sql(dsn, breaking, schema, bad)
    leases = await aclient.claim(worker="w", limit=10)
    assert [lease.job_id for lease in leases] == [good]
    job = await aclient.get_job(bad)
    assert job is not None and job.status is JobStatus.DEAD and job.last_error_code == code
