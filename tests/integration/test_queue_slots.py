"""A queue limit's slots on the job rows (jobs.queue_slot, migration 0016), on a real
PostgreSQL: the claim's fast path, its fall-back when a number is still held, the CHECK that
keeps a slot off rows that are not running, and the upgrade from slot rows. Each test names
the boundary it breaks and the invariant that must survive it."""

from __future__ import annotations

import datetime as dt
import threading
import time

import psycopg
import pytest

import leaseq
from leaseq import JobStatus
from leaseq.sql import migrations
from tests.support.helpers import rows, run_sql


def _queue_slots(dsn: str, schema: str) -> dict[int, int]:
    found = rows(dsn, "SELECT id, queue_slot FROM {s}.jobs WHERE queue_slot IS NOT NULL", schema)
    return {int(r[0]): int(r[1]) for r in found}


def test_fast_claim_meeting_a_held_number_falls_back_and_admits_the_rest(
    client: leaseq.Client, dsn: str, schema: str
) -> None:
    # Boundary: the fast path's number for a candidate ((id mod limit) + 1) is held by a job
    # still running. Invariant: that statement claims nothing; the careful claim that follows
    # admits up to the free slots, in claim order, each on a number of its own.
    client.set_limit("queue:q", concurrency=3)
    ids = [int(client.enqueue("t", i, queue="q")) for i in range(6)]
    (first,) = client.claim("q", worker="w", limit=1)
    assert first.job_id == ids[0]
    # Move the held slot onto the number ids[1] would take on the fast path.
    clash = ids[1] % 3 + 1
    run_sql(dsn, "UPDATE {s}.jobs SET queue_slot = %s WHERE id = %s", schema, clash, ids[0])
    got = client.claim("q", worker="w", limit=2)  # a fast claim: the limit is at least 2
    assert [lease.job_id for lease in got] == ids[1:3], "two free slots, taken in claim order"
    held = _queue_slots(dsn, schema)
    assert sorted(held) == ids[:3] and sorted(held.values()) == [1, 2, 3]
    # Stays careful: the next claim goes through admit() and refuses at once (limit full).
    assert client.claim("q", worker="w", limit=10) == []
    assert [client.get_job(i).status for i in ids[3:]] == [JobStatus.PENDING] * 3  # type: ignore[union-attr]


def test_a_slot_on_a_row_that_is_not_running_is_refused(
    client: leaseq.Client, dsn: str, schema: str
) -> None:
    # Boundary: a statement that ends a lease but forgets the slot (hand-written SQL, or a
    # future path). Invariant: the database refuses it rather than leak the slot.
    client.set_limit("queue:q", concurrency=2)
    client.enqueue("t", queue="q")
    (lease,) = client.claim("q", worker="w", limit=1)
    assert _queue_slots(dsn, schema) == {lease.job_id: lease.job_id % 2 + 1}
    with pytest.raises(psycopg.errors.CheckViolation, match="jobs_queue_slot_running"):
        run_sql(
            dsn,
            "UPDATE {s}.jobs SET status = 'succeeded', lease_owner = NULL,"
            " lease_expires_at = NULL, finished_at = now() WHERE id = %s",
            schema,
            lease.job_id,
        )
    assert client.complete(lease)
    assert _queue_slots(dsn, schema) == {}, "the fenced completion gives the slot back"


def test_concurrent_claims_never_hold_more_than_the_limit(
    client: leaseq.Client, dsn: str, schema: str
) -> None:
    # Boundary: six clients claim at once under a limit of 2, each holding what it got for a
    # moment, so fast claims meet numbers that claims in flight are taking. Invariant: never
    # more than 2 running (sampled, and the unique index), every job run exactly once.
    client.set_limit("queue:q", concurrency=2)
    ids = {int(i) for i in client.enqueue_many([leaseq.JobSpec("t", queue="q") for _ in range(60)])}
    done: list[int] = []
    errors: list[BaseException] = []
    peak = [0]
    stop = threading.Event()

    def sample() -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            while not stop.is_set():
                (n,) = conn.execute(
                    f"SELECT count(*) FROM \"{schema}\".jobs WHERE status = 'running'"
                ).fetchone() or (0,)
                peak[0] = max(peak[0], int(n))

    def work(name: str) -> None:
        own = leaseq.Client(dsn, schema=schema, pool_size=1)
        try:
            idle_since = time.monotonic()
            while time.monotonic() - idle_since < 1.0:
                got = own.claim("q", worker=name, limit=2)
                if not got:
                    time.sleep(0.005)
                    continue
                idle_since = time.monotonic()
                time.sleep(0.01)
                done.extend(lease.job_id for lease in got if own.complete(lease))
        except BaseException as exc:  # reported below
            errors.append(exc)
        finally:
            own.close()

    sampler = threading.Thread(target=sample)
    sampler.start()
    workers = [threading.Thread(target=work, args=(f"w{i}",)) for i in range(6)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    stop.set()
    sampler.join()
    assert not errors, errors
    assert sorted(done) == sorted(ids), "every job ran exactly once"
    assert 1 <= peak[0] <= 2, peak[0]
    assert _queue_slots(dsn, schema) == {}


def test_upgrade_moves_held_queue_slots_onto_their_jobs(dsn: str, schema: str) -> None:
    # Boundary: a database at version 15 with leases holding slot rows of a queue limit and
    # of a task limit. Invariant: after the upgrade the queue slots are on their running
    # jobs (same numbers), the task slots stay rows, and completing gives both back.
    client = leaseq.Client(dsn, schema=schema)
    q = client.queries
    with psycopg.connect(dsn, autocommit=True) as conn, conn.transaction():
        conn.execute(q["create_schema"])
        conn.execute(q["create_version_table"])
        for migration in migrations(schema):
            if migration.version > 15:
                break
            conn.execute(migration.sql.encode())
            conn.execute(
                q["record_version"], {"version": migration.version, "name": migration.name}
            )
    run_sql(
        dsn,
        "INSERT INTO {s}.jobs (queue_name, task, payload, status, lease_owner,"
        " lease_expires_at, lease_token, attempt_count)"
        " VALUES ('q', 't', 'null', 'running', 'w', now() + interval '1 hour', 1, 1)",
        schema,
    )
    ((job_id,),) = rows(dsn, "SELECT id FROM {s}.jobs", schema)
    run_sql(
        dsn,
        "INSERT INTO {s}.limits (name, concurrency) VALUES ('queue:q', 5), ('task:t', 5)",
        schema,
    )
    run_sql(
        dsn,
        "INSERT INTO {s}.limit_slots (limit_name, slot, job_id, lease_token)"
        " VALUES ('queue:q', 4, %s, 1), ('task:t', 2, %s, 1)",
        schema,
        job_id,
        job_id,
    )
    try:
        assert client.migrate() >= 16
        assert _queue_slots(dsn, schema) == {job_id: 4}
        assert rows(dsn, "SELECT limit_name, slot FROM {s}.limit_slots", schema) == [("task:t", 2)]
        lease = leaseq.Lease(
            job_id=job_id,
            token=1,
            owner="w",
            task="t",
            queue="q",
            payload=None,
            attempt=1,
            max_attempts=3,
            expires_at=dt.datetime.now(dt.UTC) + dt.timedelta(hours=1),
            limited=True,
            slot_rows=True,  # claimed while the task limit existed
        )
        assert client.complete(lease)
        assert rows(dsn, "SELECT count(*) FROM {s}.held_slots", schema) == [(0,)]
    finally:
        client.close()
