"""The fenced lease lifecycle on a real PostgreSQL: the seed's crash tests 1, 2, 3, 6, 7.

Time is moved in the database (expire_lease), never slept through.
"""

from __future__ import annotations

import dataclasses
import random
import threading
from collections import Counter

import psycopg
from psycopg import sql

import leaseq
from leaseq import JobStatus
from leaseq.owners import worker_of
from leaseq.params import default_idempotency_key
from tests.support.helpers import expire_lease, make_available, rows, run_sql


def test_claim_sets_lease_from_database_time(client: leaseq.Client, dsn: str, schema: str) -> None:
    job_id = client.enqueue("t.work", {"n": 1})
    (lease,) = client.claim(worker="w1", lease_seconds=30)
    assert (lease.job_id, lease.token, lease.attempt) == (job_id, 1, 1)
    assert worker_of(lease.owner) == "w1" and lease.owner.startswith("w1/")
    assert lease.payload == {"n": 1}
    ((remaining,),) = rows(
        dsn, "SELECT extract(epoch FROM lease_expires_at - now()) FROM {s}.jobs", schema
    )
    assert 25 < float(remaining) <= 30


def test_seed_1_concurrent_claimers_never_share_a_token(dsn: str, schema: str) -> None:
    """Many claimers on separate connections, some abandoning leases that a sweeper recovers:
    every (job, token) pair is claimed once, tokens only grow, every job completes once."""
    setup = leaseq.Client(dsn, schema=schema)
    setup.migrate()
    total = 3000
    setup.enqueue_many([{"task": "t", "payload": i} for i in range(total)])

    claims: list[tuple[int, int]] = []
    completions: list[int] = []
    lock = threading.Lock()
    done = threading.Event()

    def claimer(n: int) -> None:
        rng = random.Random(n)
        c = leaseq.Client(dsn, schema=schema, pool_size=1)
        try:
            while not done.is_set():
                leases = c.claim(worker=f"w{n}", lease_seconds=0.3, limit=rng.randint(1, 20))
                with lock:
                    claims.extend((x.job_id, x.token) for x in leases)
                for lease in leases:
                    if rng.random() < 0.05:
                        continue  # "crash": drop the lease; the sweeper must recover it
                    if c.complete(lease):
                        with lock:
                            completions.append(lease.job_id)
        finally:
            c.close()

    def sweeper() -> None:
        c = leaseq.Client(
            dsn, schema=schema, pool_size=1, retry_policy=leaseq.RetryPolicy(0.001, cap=0.01)
        )
        try:
            while not done.is_set():
                c.sweep()
                done.wait(0.05)
        finally:
            c.close()

    threads = [threading.Thread(target=claimer, args=(n,)) for n in range(8)]
    threads.append(threading.Thread(target=sweeper))
    for t in threads:
        t.start()
    try:
        deadline = 120.0
        while deadline > 0:
            ((left,),) = rows(
                dsn, "SELECT count(*) FROM {s}.jobs WHERE status <> 'succeeded'", schema
            )
            if left == 0:
                break
            done.wait(0.2)
            deadline -= 0.2
    finally:
        done.set()
        for t in threads:
            t.join()
        setup.close()

    assert len(claims) == len(set(claims)), "a (job, token) pair was claimed twice"
    assert len(claims) > total, "no lease was abandoned and reclaimed: the test proved nothing"
    per_job: dict[int, list[int]] = {}
    for job_id, token in claims:
        per_job.setdefault(job_id, []).append(token)
    assert all(sorted(t) == list(range(1, len(t) + 1)) for t in per_job.values())
    counts = Counter(completions)
    assert len(counts) == total and set(counts.values()) == {1}
    ((succeeded,),) = rows(dsn, "SELECT count(*) FROM {s}.jobs WHERE status = 'succeeded'", schema)
    assert succeeded == total


def test_seed_2_crash_after_claim_is_reclaimed_with_higher_token(
    client: leaseq.Client, dsn: str, schema: str
) -> None:
    job_id = client.enqueue("t.work")
    (first,) = client.claim(worker="crashed", lease_seconds=60)
    # The worker dies here: nothing else happens to the lease until it expires.
    assert client.sweep().total == 0, "an unexpired lease must not be swept"
    expire_lease(dsn, schema, job_id)
    assert client.sweep() == leaseq.SweepResult(requeued=1, dead=0)
    make_available(dsn, schema)  # skip the back-off instead of sleeping through it
    (second,) = client.claim(worker="survivor")
    assert second.job_id == job_id
    assert second.token == first.token + 1
    assert second.attempt == first.attempt + 1
    assert client.complete(second)
    job = client.get_job(job_id)
    assert job is not None and job.status is JobStatus.SUCCEEDED
    events = [e.event for e in client.job_events(job_id)]
    assert events == ["lease_expired"]
    assert client.job_events(job_id)[0].error_code == "LEASE_EXPIRED"


def test_seed_3_stale_worker_changes_nothing(client: leaseq.Client, dsn: str, schema: str) -> None:
    job_id = client.enqueue("t.work")
    (stale,) = client.claim(worker="A", lease_seconds=60)
    expire_lease(dsn, schema, job_id)  # A "pauses" past its lease
    client.sweep()
    make_available(dsn, schema)
    (fresh,) = client.claim(worker="B", lease_seconds=60)
    assert client.complete(fresh)
    before = client.get_job(job_id)
    events_before = client.job_events(job_id)

    assert client.complete(stale) is False
    assert client.fail(stale, "LATE", detail="A woke up") is False
    assert client.heartbeat(stale) is False
    assert client.release(stale) is False

    assert client.get_job(job_id) == before
    assert client.job_events(job_id) == events_before


def test_stale_token_is_refused_even_before_the_new_owner_finishes(
    client: leaseq.Client, dsn: str, schema: str
) -> None:
    """Same owner name, older token: the token alone must fence it out."""
    job_id = client.enqueue("t.work")
    (old,) = client.claim(worker="same-name")
    expire_lease(dsn, schema, job_id)
    client.sweep()
    make_available(dsn, schema)
    (new,) = client.claim(worker="same-name")
    assert new.token == old.token + 1
    assert client.heartbeat(old) is False and client.complete(old) is False
    assert client.heartbeat(new) is True
    job = client.get_job(job_id)
    assert job is not None and job.status is JobStatus.RUNNING and job.lease_token == new.token


def test_batched_fence_checks_each_pair_in_a_mixed_batch(
    client: leaseq.Client, dsn: str, schema: str
) -> None:
    """One batch of heartbeats and completions holding several owners, ids out of order, and
    the same job twice under one owner (its stale lease and its current one), in both
    orders: every (job, owner, token) is judged on its own, none hides another."""
    ids = client.enqueue_many([{"task": "t", "payload": i} for i in range(6)])
    a1 = client.claim(worker="A", limit=2)
    b1 = client.claim(worker="B", limit=2)
    (twice,) = client.claim(worker="A")
    expire_lease(dsn, schema, twice.job_id)
    client.sweep()
    make_available(dsn, schema)
    (again,) = client.claim(worker="A")
    assert again.job_id == twice.job_id and again.token == twice.token + 1
    (untouched,) = client.claim(worker="C")

    mixed = [b1[1], again, a1[1], twice, b1[0], a1[0]]
    beat = client.heartbeat_many(mixed)
    assert beat.lost == {(twice.job_id, twice.token)}
    assert set(beat.renewed) == {x.job_id for x in (*a1, *b1, again)}

    done = client.complete_many([twice, *reversed(mixed[:3]), *mixed[4:]])
    assert done == {x.job_id for x in (*a1, *b1, again)}
    for job_id in ids:
        job = client.get_job(job_id)
        assert job is not None
        expected = JobStatus.RUNNING if job_id == untouched.job_id else JobStatus.SUCCEEDED
        assert job.status is expected
    job = client.get_job(again.job_id)
    assert job is not None and job.lease_token == again.token


def test_expired_but_unswept_lease_cannot_complete(
    client: leaseq.Client, dsn: str, schema: str
) -> None:
    """The fence checks expiry itself; it does not wait for the sweeper to notice."""
    job_id = client.enqueue("t.work")
    (lease,) = client.claim(worker="slow")
    expire_lease(dsn, schema, job_id)
    assert client.complete(lease) is False
    assert client.heartbeat(lease) is False
    job = client.get_job(job_id)
    assert job is not None and job.status is JobStatus.RUNNING


def test_heartbeat_extends_lease_in_database_time(
    client: leaseq.Client, dsn: str, schema: str
) -> None:
    client.enqueue("t.work")
    (lease,) = client.claim(worker="w", lease_seconds=5)
    assert client.heartbeat(lease, lease_seconds=120)
    ((remaining,),) = rows(
        dsn, "SELECT extract(epoch FROM lease_expires_at - now()) FROM {s}.jobs", schema
    )
    assert 110 < float(remaining) <= 120


def test_seed_6_exhausted_retries_end_dead_and_stay(
    client: leaseq.Client, dsn: str, schema: str
) -> None:
    job_id = client.enqueue("t.flaky", max_attempts=3)
    for attempt in range(1, 4):
        make_available(dsn, schema)
        (lease,) = client.claim(worker="w")
        assert lease.attempt == attempt
        assert client.fail(lease, "UPSTREAM_DOWN", detail=f"try {attempt}")
    job = client.get_job(job_id)
    assert job is not None
    assert job.status is JobStatus.DEAD
    assert job.last_error_code == "UPSTREAM_DOWN"
    assert job.attempt_count == job.max_attempts == 3
    assert job.finished_at is not None
    assert [j.job_id for j in client.list_jobs("dead")] == [job_id]
    trail = client.job_events(job_id)
    assert [e.event for e in trail] == ["retry_scheduled", "retry_scheduled", "dead"]
    assert [e.lease_token for e in trail] == [1, 2, 3]
    make_available(dsn, schema)
    assert client.claim(worker="w") == [], "a dead job must not be claimable"


def test_permanent_failure_is_dead_after_one_attempt(client: leaseq.Client) -> None:
    job_id = client.enqueue("t.bad")
    (lease,) = client.claim(worker="w")
    assert client.fail(lease, "INVALID_PAYLOAD", retryable=False)
    job = client.get_job(job_id)
    assert job is not None and job.status is JobStatus.DEAD and job.attempt_count == 1


def test_retry_is_scheduled_with_backoff_in_database_time(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    client.retry_policy = leaseq.RetryPolicy(base=100, cap=1000, rng=lambda: 0.5)
    client.enqueue("t.flaky")
    (lease,) = client.claim(worker="w")
    assert client.fail(lease, "TIMEOUT")
    ((delay,),) = rows(dsn, "SELECT extract(epoch FROM available_at - now()) FROM {s}.jobs", schema)
    assert 45 < float(delay) <= 50
    assert client.claim(worker="w") == [], "a backed-off retry is not claimable yet"


def test_seed_7_locked_row_does_not_block_the_others(
    client: leaseq.Client, dsn: str, schema: str
) -> None:
    ids = client.enqueue_many([{"task": "t", "payload": i} for i in range(50)])
    blocker = psycopg.connect(dsn)
    try:
        blocker.execute(
            sql.SQL("SELECT id FROM {}.jobs WHERE id = %s FOR UPDATE").format(
                sql.Identifier(schema)
            ),
            (ids[0],),
        )
        drained = []
        while leases := client.claim(worker="w", limit=7):
            for lease in leases:
                assert client.complete(lease)
                drained.append(lease.job_id)
        assert sorted(drained) == ids[1:]
    finally:
        blocker.rollback()
        blocker.close()
    (last,) = client.claim(worker="w")
    assert last.job_id == ids[0]


def test_release_gives_the_job_back_without_charging_an_attempt(client: leaseq.Client) -> None:
    job_id = client.enqueue("t")
    (lease,) = client.claim(worker="w")
    assert client.release(lease)
    job = client.get_job(job_id)
    assert job is not None and job.status is JobStatus.PENDING and job.attempt_count == 0
    (again,) = client.claim(worker="w2")
    assert again.token == lease.token + 1 and again.attempt == 1
    assert [e.event for e in client.job_events(job_id)] == ["released"]


def test_claim_order_is_priority_then_age(client: leaseq.Client) -> None:
    low = client.enqueue("t", priority=-5)
    first = client.enqueue("t")
    high = client.enqueue("t", priority=10)
    second = client.enqueue("t")
    order = [lease.job_id for lease in client.claim(worker="w", limit=10)]
    assert order == [high, first, second, low]


def test_delayed_job_is_not_claimable_until_due(
    client: leaseq.Client, dsn: str, schema: str
) -> None:
    client.enqueue("t", delay=3600)
    assert client.claim(worker="w") == []
    make_available(dsn, schema)
    assert len(client.claim(worker="w")) == 1


def test_queues_are_separate(client: leaseq.Client) -> None:
    client.enqueue("t", queue="emails")
    assert client.claim("default", worker="w") == []
    (lease,) = client.claim("emails", worker="w")
    assert lease.queue == "emails"


def test_sweep_of_exhausted_job_is_dead(client: leaseq.Client, dsn: str, schema: str) -> None:
    job_id = client.enqueue("t", max_attempts=1)
    client.claim(worker="gone")
    expire_lease(dsn, schema, job_id)
    assert client.sweep() == leaseq.SweepResult(requeued=0, dead=1)
    job = client.get_job(job_id)
    assert job is not None and job.status is JobStatus.DEAD
    assert job.last_error_code == "LEASE_EXPIRED"


def test_concurrent_sweepers_recover_each_lease_once(
    client: leaseq.Client, dsn: str, schema: str
) -> None:
    ids = client.enqueue_many([{"task": "t"} for _ in range(400)])
    while client.claim(worker="gone", limit=100):
        pass
    run_sql(dsn, "UPDATE {s}.jobs SET lease_expires_at = now() - interval '1 s'", schema)
    results: list[leaseq.SweepResult] = []

    def sweep() -> None:
        c = leaseq.Client(dsn, schema=schema, pool_size=1)
        results.append(c.sweep(batch_size=37))
        c.close()

    threads = [threading.Thread(target=sweep) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(r.requeued for r in results) == len(ids)
    ((events,),) = rows(
        dsn, "SELECT count(*) FROM {s}.job_events WHERE event = 'lease_expired'", schema
    )
    assert events == len(ids)


def test_cancel_pending_and_running(client: leaseq.Client) -> None:
    running_id = client.enqueue("t")
    pending_id = client.enqueue("t")
    (lease,) = client.claim(worker="w", limit=1)
    assert lease.job_id == running_id

    assert client.cancel(pending_id)
    job = client.get_job(pending_id)
    assert job is not None and job.status is JobStatus.CANCELLED

    assert client.cancel(running_id, actor="ops", reason="not needed")
    job = client.get_job(running_id)
    assert job is not None and job.status is JobStatus.RUNNING and job.cancel_requested_at
    assert lease.job_id in client.heartbeat_many([lease]).cancel_requested
    # A failure after a cancel request ends cancelled, not retried.
    assert client.fail(lease, "STOPPED")
    job = client.get_job(running_id)
    assert job is not None and job.status is JobStatus.CANCELLED
    assert client.cancel(running_id) is False, "finished jobs cannot be cancelled"
    assert [e.event for e in client.job_events(running_id)] == ["cancel_requested", "cancelled"]
    assert [e.event for e in client.job_events(pending_id)] == ["cancelled"]


def test_replay_dead_job_keeps_id_and_audits(client: leaseq.Client) -> None:
    job_id = client.enqueue("t", max_attempts=1)
    (lease,) = client.claim(worker="w")
    client.fail(lease, "BROKEN", retryable=False)
    assert client.replay(job_id, reason="fixed the parser", actor="alice")
    job = client.get_job(job_id)
    assert job is not None and job.status is JobStatus.PENDING and job.attempt_count == 0
    replayed = client.job_events(job_id)[-1]
    assert (replayed.event, replayed.actor, replayed.detail) == (
        "replayed",
        "alice",
        "fixed the parser",
    )
    assert replayed.attempt == 1, "the attempts used before the replay stay in the trail"
    (again,) = client.claim(worker="w")
    assert again.job_id == job_id and again.token == lease.token + 1
    assert client.complete(again)
    assert client.replay(job_id, reason="again") is False, "only dead jobs can be replayed"


async def test_async_client_has_the_same_lifecycle(aclient: leaseq.AsyncClient) -> None:
    job_id = await aclient.enqueue("t.async", {"a": 1})
    (lease,) = await aclient.claim(worker="aw")
    assert await aclient.heartbeat(lease)
    assert await aclient.complete(lease)
    assert await aclient.complete(lease) is False
    job = await aclient.get_job(job_id)
    assert job is not None and job.status is JobStatus.SUCCEEDED


def test_claimed_lease_matches_the_row_and_a_lease_built_normally(
    client: leaseq.Client, dsn: str, schema: str
) -> None:
    """claim() builds Leases on a fast path (times sent as seconds, no dataclass __init__):
    every field must equal what the row says, and the object one built through __init__."""
    client.enqueue("t.plain", {"a": 1}, delay=0)
    keyed = client.enqueue(
        "t.keyed", [1, 2], ordering_key="k", idempotency_key="idem", payload_version=3
    )
    run_sql(dsn, "UPDATE {s}.jobs SET created_at = created_at - interval '3 days'", schema)
    leases = client.claim(worker="w", lease_seconds=12.345678, limit=2)
    assert len(leases) == 2
    for lease in leases:
        ((started, expires, created, available, key, idem, version),) = rows(
            dsn,
            "SELECT started_at, lease_expires_at, created_at, available_at, ordering_key, "
            "idempotency_key, payload_version FROM {s}.jobs WHERE id = %s",
            schema,
            lease.job_id,
        )
        assert lease.claimed_at == started
        assert lease.expires_at == expires
        assert (lease.created_at, lease.available_at) == (created, available)
        # Without a key given at enqueue, the default: the id and created_at (UTC, to the
        # microsecond), built by the claim exactly as its Python twin builds it.
        assert (lease.ordering_key, lease.idempotency_key, lease.payload_version) == (
            key,
            idem or default_idempotency_key(lease.job_id, created),
            version,
        )
        normal = leaseq.Lease(
            **{
                f.name: getattr(lease, f.name)
                for f in dataclasses.fields(leaseq.Lease)
                if f.name != "claimed_monotonic"
            },
            claimed_monotonic=lease.claimed_monotonic,
        )
        assert normal == lease and repr(normal) == repr(lease)
        assert vars(normal) == vars(lease)
    assert {lease.job_id for lease in leases if lease.ordering_key} == {keyed}
