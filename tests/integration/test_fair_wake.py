"""A fair queue's key is woken by whatever makes one of its jobs claimable (migration 0029,
docs/fairness.md), on a real PostgreSQL. Each test parks the key as long as a park lasts
(5 s, what a key with nothing claimable for a while gets), makes a job of it claimable by
one path other than an enqueue, and claims at once: the job is claimed by that very claim,
which it could only be if the path unparked its key (or, for a time-based path, parked it
no later than the job's own time). No wall-clock thresholds: the park is set far longer
than the test's steps take, and the assertions are about which claim gets which job."""

from __future__ import annotations

import time

import leaseq
from tests.support.helpers import rows, run_sql


def _park(dsn: str, schema: str, key: str) -> None:
    """Park ``key`` for the longest park (5 s), as the claims would after a long idle."""
    run_sql(
        dsn,
        "UPDATE {s}.fair_keys SET parked_until = now() + interval '5 seconds', park_step = 5 "
        "WHERE fairness_key = %s",
        schema,
        key,
    )


def _parked(dsn: str, schema: str, key: str) -> bool:
    ((parked,),) = rows(
        dsn,
        "SELECT parked_until IS NOT NULL AND parked_until > now() FROM {s}.fair_keys "
        "WHERE fairness_key = %s",
        schema,
        key,
    )
    return bool(parked)


def _claim_ids(client: leaseq.Client, limit: int = 10) -> list[int]:
    return sorted(lease.job_id for lease in client.claim("default", worker="w", limit=limit))


def _busy_other_key(client: leaseq.Client) -> None:
    """Another key with work, so the queue stays fair and busy while ours is parked."""
    client.enqueue_many([{"task": "t", "fairness_key": "other"} for _ in range(50)])


def test_a_replay_unparks_the_key(client: leaseq.Client, dsn: str, schema: str) -> None:
    _busy_other_key(client)
    job = client.enqueue("t", fairness_key="x", max_attempts=1, priority=5)
    (lease,) = [x for x in client.claim("default", worker="w", limit=2) if x.job_id == job]
    assert client.fail(lease, "BOOM", retryable=False)
    _park(dsn, schema, "x")
    assert client.replay(job, reason="test")
    assert not _parked(dsn, schema, "x")
    assert job in _claim_ids(client)


def test_the_next_job_of_an_ordering_key_unparks_the_key(
    client: leaseq.Client, dsn: str, schema: str
) -> None:
    _busy_other_key(client)
    first = client.enqueue("t", fairness_key="x", ordering_key="ok", priority=5)
    second = client.enqueue("t", fairness_key="x", ordering_key="ok", priority=5)
    leases = client.claim("default", worker="w", limit=2)
    head = next(x for x in leases if x.job_id == first)
    assert second not in _claim_ids(client), "blocked behind its head"
    _park(dsn, schema, "x")
    assert client.complete(head)
    assert second in _claim_ids(client)


def test_a_retry_parks_the_key_no_later_than_its_backoff(
    client: leaseq.Client, dsn: str, schema: str
) -> None:
    _busy_other_key(client)
    job = client.enqueue("t", fairness_key="x", priority=5)
    (lease,) = [x for x in client.claim("default", worker="w", limit=2) if x.job_id == job]
    _park(dsn, schema, "x")
    assert client.fail(lease, "BOOM", retry_in=1.0)
    assert not _parked(dsn, schema, "x"), "the retry's own transaction unparked it"
    client.claim("default", worker="w", limit=10)  # finds nothing of x: parks it again
    ((parked_until, available_at),) = rows(
        dsn,
        "SELECT f.parked_until, j.available_at FROM {s}.fair_keys AS f, {s}.jobs AS j "
        "WHERE f.fairness_key = 'x' AND j.id = %s",
        schema,
        job,
    )
    assert parked_until is not None and parked_until <= available_at
    _wait_until(dsn, available_at)
    assert job in _claim_ids(client)


def test_a_delayed_job_parks_its_key_no_later_than_its_time(
    client: leaseq.Client, dsn: str, schema: str
) -> None:
    _busy_other_key(client)
    job = client.enqueue("t", fairness_key="x", delay=1.0)
    run_sql(  # the key has been parked long already, with its longest step
        dsn, "UPDATE {s}.fair_keys SET park_step = 5 WHERE fairness_key = 'x'", schema
    )
    client.claim("default", worker="w", limit=10)  # x has nothing claimable yet: parked
    ((parked_until, available_at),) = rows(
        dsn,
        "SELECT f.parked_until, j.available_at FROM {s}.fair_keys AS f, {s}.jobs AS j "
        "WHERE f.fairness_key = 'x' AND j.id = %s",
        schema,
        job,
    )
    assert parked_until is not None and parked_until <= available_at
    _wait_until(dsn, available_at)
    assert job in _claim_ids(client)


def test_a_resumed_pause_unparks_the_key(client: leaseq.Client, dsn: str, schema: str) -> None:
    _busy_other_key(client)
    client.pause(task="p", reason="test")
    job = client.enqueue("p", fairness_key="x")
    assert job not in _claim_ids(client)
    _park(dsn, schema, "x")
    client.resume(task="p", reason="test")
    assert job in _claim_ids(client)


def test_a_signal_unparks_the_key(client: leaseq.Client, dsn: str, schema: str) -> None:
    _busy_other_key(client)
    job = client.enqueue("t", fairness_key="x", priority=5)
    (lease,) = [x for x in client.claim("default", worker="w", limit=2) if x.job_id == job]
    decision, _ = client.wait_point(lease, record="w", until=None, signal="go")
    assert decision.name == "SUSPEND"
    _park(dsn, schema, "x")
    assert client.signal(job, "go")
    assert job in _claim_ids(client)


def test_a_sleeper_woken_by_a_claim_unparks_its_key(
    client: leaseq.Client, dsn: str, schema: str
) -> None:
    _busy_other_key(client)
    job = client.enqueue("t", fairness_key="x", priority=5)
    (lease,) = [x for x in client.claim("default", worker="w", limit=2) if x.job_id == job]
    decision, _ = client.wait_point(lease, record="s", until=time.time() + 3600, signal=None)
    assert decision.name == "SUSPEND"
    run_sql(dsn, "UPDATE {s}.jobs SET wake_at = now() WHERE id = %s", schema, job)
    _park(dsn, schema, "x")
    assert job not in _claim_ids(client), "this claim wakes it (its snapshot cannot see it)"
    assert not _parked(dsn, schema, "x")
    assert job in _claim_ids(client)


def test_a_met_dependency_unparks_the_key(client: leaseq.Client, dsn: str, schema: str) -> None:
    _busy_other_key(client)
    parent = client.enqueue("t", fairness_key="y", priority=5)
    child = client.enqueue("t", fairness_key="x", depends_on=[parent])
    (lease,) = [x for x in client.claim("default", worker="w", limit=2) if x.job_id == parent]
    _park(dsn, schema, "x")
    assert client.complete(lease)
    assert child in _claim_ids(client)


def test_a_released_job_unparks_the_key(client: leaseq.Client, dsn: str, schema: str) -> None:
    _busy_other_key(client)
    job = client.enqueue("t", fairness_key="x", priority=5)
    (lease,) = [x for x in client.claim("default", worker="w", limit=2) if x.job_id == job]
    _park(dsn, schema, "x")
    assert client.release(lease)
    assert job in _claim_ids(client)


def test_a_keyless_job_never_makes_a_plain_queue_fair(
    client: leaseq.Client, dsn: str, schema: str
) -> None:
    job = client.enqueue("t", queue="plain", max_attempts=1)
    (lease,) = client.claim("plain", worker="w")
    assert client.fail(lease, "BOOM", retryable=False)
    assert client.replay(job, reason="test")
    assert rows(dsn, "SELECT count(*) FROM {s}.fair_keys", schema) == [(0,)]
    assert [x.job_id for x in client.claim("plain", worker="w")] == [job]


def _wait_until(dsn: str, instant: object) -> None:
    """Sleep until the database clock passes ``instant``."""
    while True:
        with_rows = rows(dsn, "SELECT %s::timestamptz <= now() FROM (SELECT) AS x", "s", instant)
        if with_rows[0][0]:
            return
        time.sleep(0.05)
