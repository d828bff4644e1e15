"""Concurrency and rate limits on a real PostgreSQL: slots are taken in the claim statement
under a primary key and given back by the fenced statement that ends the lease, matched by
its token. Each test names the boundary it breaks and the invariant that must survive it."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import psycopg
import pytest

import leaseq
from leaseq import ConfigError, JobStatus, RateLimit
from leaseq.worker.listener import LISTENER_APPLICATION_NAME
from tests.support.helpers import expire_lease, rows

FAST = leaseq.RetryPolicy(base=0.001, cap=0.01)


def _slots(dsn: str, schema: str) -> list[tuple[str, int, int, int]]:
    found = rows(
        dsn,
        "SELECT limit_name, slot, job_id, lease_token FROM {s}.held_slots ORDER BY 1, 2",
        schema,
    )
    return [(r[0], r[1], r[2], r[3]) for r in found]


def _status(client: leaseq.Client, job_id: int) -> tuple[JobStatus, int]:
    job = client.get_job(job_id)
    assert job is not None
    return job.status, job.attempt_count


def test_queue_limit_caps_a_claim_and_charges_nothing_to_the_jobs_left(
    client: leaseq.Client, dsn: str, schema: str
) -> None:
    ids = [int(client.enqueue("t", i, queue="q")) for i in range(6)]
    client.set_limit("queue:q", concurrency=2)
    got = client.claim("q", worker="w", limit=10)
    assert [x.job_id for x in got] == ids[:2]
    assert all(x.limited for x in got)
    # The others: still pending, in place, no attempt charged.
    assert [_status(client, i) for i in ids[2:]] == [(JobStatus.PENDING, 0)] * 4
    assert client.claim("q", worker="w2", limit=10) == []
    assert {(s[0], s[2]) for s in _slots(dsn, schema)} == {("queue:q", ids[0]), ("queue:q", ids[1])}
    # Completing one frees exactly one slot, in the same statement; the next claim gets one.
    assert client.complete(got[0])
    assert [s[2] for s in _slots(dsn, schema)] == [ids[1]]
    nxt = client.claim("q", worker="w", limit=10)
    assert [x.job_id for x in nxt] == [ids[2]]


def test_no_limit_defined_claims_as_before_and_leases_are_plain(client: leaseq.Client) -> None:
    for i in range(3):
        client.enqueue("t", i, queue="q")
    client.set_limit("queue:other", concurrency=1)  # a queue limit elsewhere changes nothing
    got = client.claim("q", worker="w", limit=10)
    assert len(got) == 3 and not any(x.limited for x in got)


def test_a_full_key_is_stepped_over_and_other_keys_run(
    client: leaseq.Client, dsn: str, schema: str
) -> None:
    client.set_limit("key:cust:*", concurrency=1)
    a1 = int(client.enqueue("t", 1, queue="q", limit_key="cust:a"))
    a2 = int(client.enqueue("t", 2, queue="q", limit_key="cust:a"))
    b1 = int(client.enqueue("t", 3, queue="q", limit_key="cust:b"))
    free = int(client.enqueue("t", 4, queue="q"))
    got = client.claim("q", worker="w", limit=10)
    assert sorted(x.job_id for x in got) == [a1, b1, free]
    assert _status(client, a2) == (JobStatus.PENDING, 0)
    assert [(s[0], s[1]) for s in _slots(dsn, schema)] == [("key:cust:a", 1), ("key:cust:b", 1)]


def test_task_limit_set_later_applies_to_jobs_already_queued(client: leaseq.Client) -> None:
    for i in range(4):
        client.enqueue("send", i, queue="q")
    client.set_limit("task:send", concurrency=1)
    assert len(client.claim("q", worker="w", limit=10)) == 1


def test_every_limit_must_admit_and_a_refusal_gives_back_what_it_took(
    client: leaseq.Client, dsn: str, schema: str
) -> None:
    client.set_limit("queue:q", concurrency=5)
    client.set_limit("key:k", concurrency=1)
    first = int(client.enqueue("t", 1, queue="q", limit_key="k"))
    second = int(client.enqueue("t", 2, queue="q", limit_key="k"))
    got = client.claim("q", worker="w", limit=10)
    assert [x.job_id for x in got] == [first]
    # The second took a queue slot, then found the key full: the queue slot went back.
    assert sorted(s[0] for s in _slots(dsn, schema)) == ["key:k", "queue:q"]
    assert _status(client, second) == (JobStatus.PENDING, 0)


def test_sweep_of_a_crashed_workers_lease_frees_its_slot_and_the_stale_worker_frees_nothing(
    client: leaseq.Client, dsn: str, schema: str
) -> None:
    client.set_limit("queue:q", concurrency=1)
    job = int(client.enqueue("t", None, queue="q"))
    stale = client.claim("q", worker="dead", limit=1, lease_seconds=30)[0]
    expire_lease(dsn, schema, job)
    client.sweep(policies={"t": FAST})
    assert _slots(dsn, schema) == []
    time.sleep(0.02)  # the retry's back-off (FAST: at most 10 ms)
    fresh = client.claim("q", worker="alive", limit=1)[0]
    assert fresh.token == stale.token + 1
    held = _slots(dsn, schema)
    assert [(s[2], s[3]) for s in held] == [(job, fresh.token)]
    # The stale worker comes back: every write it tries is refused and frees nothing.
    assert not client.complete(stale)
    assert not client.fail(stale, "X")
    assert client.release_many([stale]) == set()
    assert _slots(dsn, schema) == held
    assert client.complete(fresh)
    assert _slots(dsn, schema) == []


@pytest.mark.parametrize("how", ["fail_retry", "fail_dead", "release", "unique_complete"])
def test_each_fenced_end_of_a_lease_gives_its_slot_back(
    client: leaseq.Client, dsn: str, schema: str, how: str
) -> None:
    client.set_limit("queue:q", concurrency=1)
    unique = "u" if how == "unique_complete" else None
    job = int(client.enqueue("t", None, queue="q", unique_key=unique))
    lease = client.claim("q", worker="w", limit=1)[0]
    assert len(_slots(dsn, schema)) == 1
    if how == "fail_retry":
        assert client.fail(lease, "X", retry_in=0)
    elif how == "fail_dead":
        assert client.fail(lease, "X", retryable=False)
    elif how == "release":
        assert client.release(lease)
    else:
        assert client.complete(lease)
    assert _slots(dsn, schema) == [], how
    assert client.get_job(job) is not None


def test_a_cancel_request_ends_through_the_fenced_failure_and_frees_the_slot(
    client: leaseq.Client, dsn: str, schema: str
) -> None:
    client.set_limit("queue:q", concurrency=1)
    job = int(client.enqueue("t", None, queue="q"))
    lease = client.claim("q", worker="w", limit=1)[0]
    client.cancel(job)
    assert len(_slots(dsn, schema)) == 1  # the lease is still valid: the slot is held
    assert client.fail(lease, "CANCELLED")
    assert _status(client, job)[0] == JobStatus.CANCELLED
    assert _slots(dsn, schema) == []


def test_ordering_key_wins_a_limit_never_reorders_a_key(client: leaseq.Client) -> None:
    client.set_limit("key:k", concurrency=1)
    other = int(client.enqueue("t", 0, queue="q", limit_key="k"))
    first = int(client.enqueue("t", 1, queue="q", ordering_key="o", limit_key="k"))
    second = int(client.enqueue("t", 2, queue="q", ordering_key="o"))
    got = client.claim("q", worker="w", limit=10)
    # The key's head is held back by the limit; the job behind it (no limit of its own)
    # stays blocked behind its head instead of overtaking it.
    assert [x.job_id for x in got] == [other]
    assert _status(client, first) == (JobStatus.PENDING, 0)
    assert client.claim("q", worker="w", limit=10) == []
    assert client.complete(got[0])
    head = client.claim("q", worker="w", limit=10)
    assert [x.job_id for x in head] == [first]
    assert client.complete(head[0])
    assert [x.job_id for x in client.claim("q", worker="w", limit=10)] == [second]


def test_lowering_a_limit_takes_no_slot_away_and_holds_later_claims(
    client: leaseq.Client, dsn: str, schema: str
) -> None:
    for i in range(6):
        client.enqueue("t", i, queue="q")
    client.set_limit("queue:q", concurrency=3)
    got = client.claim("q", worker="w", limit=10)
    assert len(got) == 3
    client.set_limit("queue:q", concurrency=1)
    client.complete(got[0])
    client.complete(got[1])
    # Slot 3 is still held, above the new limit: nothing more runs until it is freed.
    assert client.claim("q", worker="w", limit=10) == []
    client.complete(got[2])
    assert len(client.claim("q", worker="w", limit=10)) == 1


def test_concurrent_claimers_never_hold_more_slots_than_the_limit(
    client: leaseq.Client, dsn: str, schema: str
) -> None:
    client.set_limit("queue:q", concurrency=3)
    client.enqueue_many([{"task": "t", "queue": "q"} for _ in range(200)])
    seen: list[int] = []
    errors: list[BaseException] = []

    def claimer(n: int) -> None:
        c = leaseq.Client(dsn, schema=schema)
        try:
            for _ in range(15):
                for lease in c.claim("q", worker=f"w{n}", limit=5):
                    c.complete(lease)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            c.close()

    def sampler(stop: threading.Event) -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            while not stop.is_set():
                row = conn.execute(
                    f"SELECT count(*) FROM {schema}.jobs WHERE status = 'running'"
                ).fetchone()
                assert row is not None
                seen.append(int(row[0]))

    stop = threading.Event()
    watch = threading.Thread(target=sampler, args=(stop,))
    watch.start()
    workers = [threading.Thread(target=claimer, args=(n,)) for n in range(6)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    stop.set()
    watch.join()
    assert not errors
    assert seen and max(seen) <= 3
    done = rows(dsn, "SELECT count(*) FROM {s}.jobs WHERE status = 'succeeded'", schema)
    assert done[0][0] > 0
    assert _slots(dsn, schema) == []


def test_rate_limit_admits_burst_then_one_per_interval(client: leaseq.Client) -> None:
    client.enqueue_many([{"task": "t", "queue": "q"} for _ in range(10)])
    client.set_limit("queue:q", rate=RateLimit(2, per=1.0, burst=3))
    got = client.claim("q", worker="w", limit=10)
    assert len(got) == 3  # the burst
    assert client.claim("q", worker="w", limit=10) == []
    exists, wait = client.claim_wait(["q"])
    assert exists and wait is not None and 0 < wait <= 0.5
    time.sleep(wait + 0.02)
    assert len(client.claim("q", worker="w", limit=10)) == 1


def test_rate_consume_charges_the_same_bucket_as_claims(client: leaseq.Client) -> None:
    client.set_limit("key:api:*", rate=RateLimit(1, per=3600, burst=2))
    job = int(client.enqueue("t", None, queue="q", limit_key="api:x"))
    assert client.rate_available("key:api:x")[0] == 2
    assert client.rate_consume("key:api:x")
    assert client.rate_consume("key:api:x")
    assert not client.rate_consume("key:api:x")  # refused: nothing charged
    available, wait = client.rate_available("key:api:x")
    assert available == 0 and wait > 0
    assert client.claim("q", worker="w", limit=1) == []
    assert _status(client, job) == (JobStatus.PENDING, 0)
    # Another key of the family has its own bucket.
    assert client.rate_consume("key:api:y", cost=2)


def test_a_rate_refusal_after_a_slot_gives_the_slot_back(
    client: leaseq.Client, dsn: str, schema: str
) -> None:
    client.set_limit("queue:q", concurrency=10, rate=RateLimit(1, per=3600, burst=1))
    client.enqueue_many([{"task": "t", "queue": "q"} for _ in range(3)])
    assert len(client.claim("q", worker="w", limit=10)) == 1
    assert len(_slots(dsn, schema)) == 1


def test_limits_list_shows_slots_waiting_and_bucket(client: leaseq.Client) -> None:
    client.set_limit("queue:q", concurrency=2, actor="ops", reason="protect db")
    client.set_limit("key:cust:*", concurrency=1)
    for i in range(5):
        client.enqueue("t", i, queue="q", limit_key=f"cust:{i % 2}")
    client.claim("q", worker="w", limit=10)
    by_name = {x.name: x for x in client.limits()}
    assert by_name["queue:q"].in_use == 2 and by_name["queue:q"].waiting == 3
    assert by_name["key:cust:*"].in_use == 2 and by_name["key:cust:*"].waiting == 3
    events = client.admin_events()
    assert any(e.action == "limit_set" and e.value == "queue:q" for e in events)
    assert client.remove_limit("queue:q", actor="ops")
    assert not client.remove_limit("queue:q")


@pytest.mark.parametrize(
    ("name", "kwargs"),
    [
        ("q", {"concurrency": 1}),
        ("pool:x", {"concurrency": 1}),
        ("queue:q", {}),
        ("queue:q", {"concurrency": 0}),
        ("queue:q", {"concurrency": True}),
    ],
)
def test_bad_limits_are_refused_and_store_nothing(
    client: leaseq.Client, name: str, kwargs: dict[str, object]
) -> None:
    with pytest.raises(ConfigError):
        client.set_limit(name, **kwargs)  # type: ignore[arg-type]
    assert client.limits() == []


def test_bad_rates_are_refused() -> None:
    for args in [(0,), (-1,), (float("inf"),), (1, 0), (1, 1, 0)]:
        with pytest.raises(ConfigError):
            RateLimit(*args)  # type: ignore[arg-type]


def test_bad_limit_key_is_refused_and_stores_nothing(
    client: leaseq.Client, dsn: str, schema: str
) -> None:
    with pytest.raises(ConfigError):
        client.enqueue("t", None, limit_key="")
    assert rows(dsn, "SELECT count(*) FROM {s}.jobs", schema) == [(0,)]


def test_limit_metrics_show_slots_waiting_jobs_and_rate_wait(client: leaseq.Client) -> None:
    from prometheus_client import generate_latest

    from leaseq.db_metrics import database_registry

    client.set_limit("queue:q", concurrency=2)
    client.set_limit("key:api", rate=RateLimit(1, per=3600))
    client.set_limit("key:cust:*", concurrency=1)
    for i in range(3):
        client.enqueue("t", i, queue="q")
    for _ in range(2):
        client.enqueue("t", None, queue="fam", limit_key="cust:a")
    client.claim("q", worker="w", limit=10)
    client.claim("fam", worker="w", limit=10)
    assert client.rate_consume("key:api")
    registry = database_registry(
        lambda: (client.queue_stats(), {**client.database_health(), "limits": client.limits()})
    )
    text = generate_latest(registry).decode()
    assert 'leaseq_limit_slots_in_use{limit="queue:q"} 2.0' in text
    assert 'leaseq_limit_concurrency{limit="queue:q"} 2.0' in text
    assert 'leaseq_limit_waiting_jobs{limit="queue:q"} 1.0' in text
    # A family's gauges too (its waiting jobs were not computed before).
    assert 'leaseq_limit_slots_in_use{limit="key:cust:*"} 1.0' in text
    assert 'leaseq_limit_waiting_jobs{limit="key:cust:*"} 1.0' in text
    wait = [
        x
        for x in text.splitlines()
        if x.startswith('leaseq_limit_rate_wait_seconds{limit="key:api"}')
    ]
    assert wait and float(wait[0].split()[-1]) > 3000


def test_concurrent_claims_never_overspend_a_bucket_and_never_deadlock(
    client: leaseq.Client, dsn: str, schema: str
) -> None:
    # Two rate limits per job (its queue's and its key's), no refill within the test: each
    # bucket admits exactly its burst, whatever the interleaving of six claimers.
    client.set_limit("queue:q", rate=RateLimit(1, per=3600, burst=12))
    client.set_limit("key:k:*", rate=RateLimit(1, per=3600, burst=3))
    client.enqueue_many([{"task": "t", "queue": "q", "limit_key": f"k:{i % 3}"} for i in range(60)])
    errors: list[BaseException] = []

    def claimer(n: int) -> None:
        c = leaseq.Client(dsn, schema=schema)
        try:
            for _ in range(10):
                c.claim("q", worker=f"w{n}", limit=4)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            c.close()

    threads = [threading.Thread(target=claimer, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    per_key = rows(
        dsn,
        "SELECT limit_key, count(*) FROM {s}.jobs WHERE status = 'running' GROUP BY 1",
        schema,
    )
    assert all(n <= 3 for _, n in per_key), per_key
    assert sum(n for _, n in per_key) <= 12
    # Every refused job is untouched: pending, no attempt charged.
    assert rows(
        dsn, "SELECT count(*) FROM {s}.jobs WHERE status = 'pending' AND attempt_count > 0", schema
    ) == [(0,)]


def _notifications(conn: psycopg.Connection[tuple[object, ...]]) -> list[str]:
    return [n.payload for n in conn.notifies(timeout=0.3, stop_after=10)]


def test_a_slot_freed_of_a_limit_that_refused_wakes_the_workers_and_a_limit_never_reached_is_silent(
    client: leaseq.Client, dsn: str, schema: str
) -> None:
    # Boundary: a worker refused by a concurrency limit, with no enqueue to wake it. The
    # statement that frees the slot must NOTIFY its queue; a limit that never refused sends
    # nothing, so it costs the completions no notification.
    client.set_limit("queue:q", concurrency=1)
    client.set_limit("queue:roomy", concurrency=1000)
    for _ in range(2):
        client.enqueue("t", None, queue="q")
        client.enqueue("t", None, queue="roomy")
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute(f'LISTEN "{client.channel}"')
        roomy = client.claim("roomy", worker="w", limit=10)
        assert len(roomy) == 2 and all(x.limited for x in roomy)
        _notifications(listener)  # the enqueues' own
        assert client.complete_many(roomy) == {x.job_id for x in roomy}
        assert _notifications(listener) == []
        held = client.claim("q", worker="w", limit=10)
        assert len(held) == 1
        assert client.claim("q", worker="w2", limit=10) == []  # refused: the limit bites
        assert client.complete(held[0])
        assert _notifications(listener) == ["q"]
    assert len(client.claim("q", worker="w2", limit=10)) == 1


def test_a_claim_in_flight_does_not_make_a_roomy_limit_refuse_another_claim(
    client: leaseq.Client, dsn: str, schema: str
) -> None:
    # Boundary: two claims under one limit far from full, the first not yet committed. Its
    # slot numbers are taken (advisory locks) but invisible; the second must take the next
    # free numbers, not find "its" numbers busy and refuse.
    client.set_limit("queue:q", concurrency=100)
    client.enqueue_many([{"task": "t", "queue": "q"} for _ in range(4)])
    with psycopg.connect(dsn) as first:  # a transaction left open
        a = client.claim("q", worker="a", limit=2, connection=first)
        b = client.claim("q", worker="b", limit=2)
        assert len(a) == 2 and len(b) == 2
        first.commit()
    held = _slots(dsn, schema)
    assert len({s[1] for s in held}) == 4
    assert sorted(s[2] for s in held) == sorted(x.job_id for x in a + b)


def test_a_limited_lease_completes_in_one_statement_and_a_stale_one_frees_nothing(
    client: leaseq.Client, dsn: str, schema: str
) -> None:
    client.set_limit("queue:q", concurrency=2)
    first, second = (int(client.enqueue("t", i, queue="q")) for i in range(2))
    got = client.claim("q", worker="w", limit=2)
    stale = next(x for x in got if x.job_id == first)
    expire_lease(dsn, schema, first)
    assert client.sweep(policies={"t": FAST}).requeued == 1
    time.sleep(0.02)  # the retry's back-off (FAST: at most 10 ms)
    again = client.claim("q", worker="w2", limit=2)
    assert [x.job_id for x in again] == [first]
    # The stale lease's completion is refused by the fence and frees nothing.
    assert client.complete_many([stale]) == set()
    assert sorted(s[2] for s in _slots(dsn, schema)) == [first, second]
    assert client.complete_many(again + [x for x in got if x.job_id == second]) == {
        first,
        second,
    }
    assert _slots(dsn, schema) == []


def test_a_limited_lease_that_gained_a_dependent_completes_and_promotes_it(
    client: leaseq.Client, dsn: str, schema: str
) -> None:
    # Boundary: the one-statement completion of limited leases skips jobs with dependents;
    # a dependent enqueued after the claim must still be promoted (the coordinated path).
    client.set_limit("queue:q", concurrency=5)
    parent = int(client.enqueue("t", 1, queue="q"))
    (lease,) = client.claim("q", worker="w", limit=1)
    assert lease.limited and not lease.has_dependents
    child = int(client.enqueue("t", 2, queue="q", depends_on=[parent]))
    assert client.complete(lease)
    assert _slots(dsn, schema) == []
    job = client.get_job(child)
    assert job is not None and job.status is JobStatus.PENDING
    assert [x.job_id for x in client.claim("q", worker="w", limit=5)] == [child]


def test_limits_list_counts_the_jobs_waiting_on_a_family(client: leaseq.Client) -> None:
    client.set_limit("key:cust:*", concurrency=1)
    client.set_limit("key:cust:vip", concurrency=5)  # its own limit: not the family's
    client.set_limit("queue:*", concurrency=50)
    for key in ["cust:a", "cust:a", "cust:b", "cust:vip", "other:x"]:
        client.enqueue("t", None, queue="q", limit_key=key)
    by_name = {x.name: x for x in client.limits()}
    assert by_name["key:cust:*"].waiting == 3
    assert by_name["key:cust:vip"].waiting == 1
    assert by_name["queue:*"].waiting == 5
    client.claim("q", worker="w", limit=10)
    by_name = {x.name: x for x in client.limits()}
    # cust:a and cust:b got their one slot each; the second cust:a waits.
    assert by_name["key:cust:*"].in_use == 2 and by_name["key:cust:*"].waiting == 1


def test_a_limited_lease_that_gained_a_dependent_fails_dead_and_cancels_it(
    client: leaseq.Client, dsn: str, schema: str
) -> None:
    # As above for the one-statement failure of limited leases (fail_limited_jobs).
    client.set_limit("queue:q", concurrency=5)
    parent = int(client.enqueue("t", 1, queue="q"))
    (lease,) = client.claim("q", worker="w", limit=1)
    child = int(client.enqueue("t", 2, queue="q", depends_on=[parent]))
    assert client.fail(lease, "BOOM", retryable=False)
    assert _slots(dsn, schema) == []
    assert _status(client, parent) == (JobStatus.DEAD, 1)
    assert _status(client, child) == (JobStatus.CANCELLED, 0)


def test_a_held_slot_number_where_the_search_starts_is_passed_over(
    client: leaseq.Client, dsn: str, schema: str
) -> None:
    # Boundary: the slot search starts at the first candidate's id (mod the limit); a number
    # held there must be passed over, not doubled and not fail the claim.
    client.set_limit("queue:q", concurrency=100)
    first = int(client.enqueue("t", 1, queue="q"))
    second = int(client.enqueue("t", 2, queue="q"))
    (held,) = client.claim("q", worker="w", limit=1)
    assert held.job_id == first
    guess = second % 100 + 1  # where the second claim's search starts
    moved = "UPDATE {s}.jobs SET queue_slot = %s WHERE id = %s RETURNING id"
    assert rows(dsn, moved, schema, guess, first) == [(first,)]
    (got,) = client.claim("q", worker="w", limit=1)
    assert got.job_id == second
    slots = _slots(dsn, schema)
    assert sorted(s[2] for s in slots) == [first, second]
    assert len({s[1] for s in slots}) == 2 and guess in {s[1] for s in slots}


async def test_a_worker_held_back_by_a_limit_claims_when_another_process_frees_the_slot(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    """Boundary: the slot is held by someone else (here a client's lease), so this worker
    frees nothing itself, and it polls once an hour. The completion elsewhere must wake it."""
    app = leaseq.App(dsn, schema=schema)
    ran = asyncio.Event()

    @app.task(name="limited")
    async def limited(ctx: leaseq.JobContext, payload: Any) -> None:
        ran.set()

    client.set_limit("queue:default", concurrency=1)
    client.enqueue("limited", 1)
    (held,) = client.claim(worker="elsewhere", limit=1)
    client.enqueue("limited", 2)
    worker = leaseq.Worker(app, leaseq.WorkerConfig(poll_interval=3600, lease_seconds=30))
    run = asyncio.create_task(worker.run())
    try:

        def refused_and_listening() -> bool:
            found = rows(
                dsn,
                "SELECT (SELECT refused_at IS NOT NULL FROM {s}.limits"
                "        WHERE name = 'queue:default'),"
                " EXISTS (SELECT 1 FROM pg_stat_activity WHERE application_name = %s"
                "         AND query LIKE %s AND state = 'idle')",
                schema,
                LISTENER_APPLICATION_NAME,
                f"LISTEN %{client.channel}%",
            )
            return bool(found[0][0] and found[0][1])

        for _ in range(500):
            if refused_and_listening():
                break
            await asyncio.sleep(0.02)
        assert refused_and_listening()
        await asyncio.sleep(0.2)  # the worker settles into its hour-long wait
        assert not ran.is_set()
        assert await asyncio.to_thread(client.complete, held)
        await asyncio.wait_for(ran.wait(), 10)
    finally:
        worker.stop()
        await asyncio.wait_for(run, 10)
