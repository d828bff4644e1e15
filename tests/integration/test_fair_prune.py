"""Fair queues' idle keys are pruned (prune_fair_keys, the worker's FairKeyPruner) on a real
PostgreSQL: only keys idle past the retention with no live job, never the queue's key ''
or a weighted key; and a prune racing an enqueue or a wake-up of the same key never loses
that key (both orders of the interleaving, each held open on purpose)."""

from __future__ import annotations

import asyncio
import threading
import time

import psycopg

import leaseq
from leaseq.metrics import WorkerMetrics
from leaseq.worker.inflight import WorkerEvents, WorkerStats
from leaseq.worker.maintenance import FairKeyPruner
from leaseq.worker.outage import Outage
from tests.support.helpers import rows, run_sql


def _keys(dsn: str, schema: str) -> set[str]:
    return {k for (k,) in rows(dsn, "SELECT fairness_key FROM {s}.fair_keys", schema)}


def _age(dsn: str, schema: str) -> None:
    """Every key idle for an hour."""
    run_sql(dsn, "UPDATE {s}.fair_keys SET active_at = now() - interval '1 hour'", schema)


def _waits_on_a_lock(dsn: str, text: str) -> bool:
    found = rows(
        dsn,
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE %s",
        "s",
        f"%{text}%",
    )
    return bool(found[0][0])


def _wait_blocked(dsn: str, text: str) -> None:
    deadline = time.monotonic() + 30
    while not _waits_on_a_lock(dsn, text):
        assert time.monotonic() < deadline, f"no statement like {text!r} waited on a lock"
        time.sleep(0.02)


def test_only_idle_keys_without_live_jobs_are_pruned(
    client: leaseq.Client, dsn: str, schema: str
) -> None:
    done = client.enqueue_many([{"task": "t", "fairness_key": k} for k in ("gone", "run")])
    client.enqueue("t", fairness_key="later", delay=3600)
    client.enqueue("t", fairness_key="fresh")
    client.set_fair_weight("default", "vip", 3)
    leases = {x.job_id: x for x in client.claim("default", worker="w", limit=10)}
    assert client.complete(leases[int(done[0])])  # "gone" has no job left; "run" runs
    client.complete(leases[max(leases)])  # "fresh" done too, but it is not idle
    _age(dsn, schema)
    run_sql(dsn, "UPDATE {s}.fair_keys SET active_at = now() WHERE fairness_key = 'fresh'", schema)
    before = _keys(dsn, schema)
    assert before == {"", "gone", "run", "later", "fresh", "vip"}
    assert client.prune_fair_keys(older_than=60) == 1
    assert _keys(dsn, schema) == before - {"gone"}
    assert client.prune_fair_keys(older_than=60) == 0


def test_a_sleeping_job_keeps_its_key(client: leaseq.Client, dsn: str, schema: str) -> None:
    job = client.enqueue("t", fairness_key="s")
    (lease,) = client.claim("default", worker="w")
    decision, _ = client.wait_point(lease, record="s", until=time.time() + 3600, signal=None)
    assert decision.name == "SUSPEND"
    _age(dsn, schema)
    assert client.prune_fair_keys(older_than=60) == 0
    run_sql(dsn, "UPDATE {s}.jobs SET wake_at = now() WHERE id = %s", schema, job)
    # The first claim wakes it (and, finding nothing else, asks once more: takes it).
    got = [x.job_id for _ in range(2) for x in client.claim("default", worker="w")]
    assert got == [job]


def test_a_prune_waiting_on_an_enqueue_of_the_key_keeps_it(
    client: leaseq.Client, dsn: str, schema: str
) -> None:
    # The enqueue's transaction has touched the key (its row locked, gen bumped) and stays
    # open; the prune, which read the key as idle, waits for it, then sees the new gen: kept.
    client.enqueue("t", fairness_key="x")
    (lease,) = client.claim("default", worker="w")
    assert client.complete(lease)
    _age(dsn, schema)
    with psycopg.connect(dsn) as conn:
        job = client.enqueue("t", fairness_key="x", connection=conn)
        pruned: list[int] = []
        thread = threading.Thread(
            target=lambda: pruned.append(client.prune_fair_keys(older_than=60))
        )
        thread.start()
        _wait_blocked(dsn, "DELETE FROM")
        conn.commit()
    thread.join(30)
    assert pruned == [0] and "x" in _keys(dsn, schema)
    assert [x.job_id for x in client.claim("default", worker="w")] == [job]


def test_an_enqueue_waiting_on_a_prune_of_the_key_brings_it_back(
    client: leaseq.Client, dsn: str, schema: str
) -> None:
    # The prune's transaction has deleted the key and stays open; an enqueue of that key
    # waits on the deleted row (its upsert), then inserts the key again: nothing is lost.
    client.enqueue("t", fairness_key="x")
    (lease,) = client.claim("default", worker="w")
    assert client.complete(lease)
    _age(dsn, schema)
    with psycopg.connect(dsn) as conn:
        statement = client.queries["prune_fair_keys"]
        deleted = conn.execute(statement, {"older_than": 60, "limit": 100}).fetchall()
        assert [k for _q, k in deleted] == ["x"]
        got: list[int] = []
        thread = threading.Thread(
            target=lambda: got.append(int(client.enqueue("t", fairness_key="x")))
        )
        thread.start()
        _wait_blocked(dsn, "fair_keys")
        conn.commit()
    thread.join(30)
    assert "x" in _keys(dsn, schema)
    assert [x.job_id for x in client.claim("default", worker="w")] == got


def test_a_replay_after_a_prune_brings_the_key_back(
    client: leaseq.Client, dsn: str, schema: str
) -> None:
    # A dead job keeps no key (it is not live); its replay re-creates the key through the
    # jobs_fair_ready trigger, so it is claimed like any other.
    job = client.enqueue("t", fairness_key="x", max_attempts=1)
    (lease,) = client.claim("default", worker="w")
    assert client.fail(lease, "BOOM", retryable=False)
    _age(dsn, schema)
    assert client.prune_fair_keys(older_than=60) == 1
    assert client.replay(job, reason="test")
    assert "x" in _keys(dsn, schema)
    assert [x.job_id for x in client.claim("default", worker="w")] == [job]


def test_the_worker_service_prunes_and_counts(client: leaseq.Client, dsn: str, schema: str) -> None:
    client.enqueue_many([{"task": "t", "fairness_key": f"k{i}"} for i in range(5)])
    for lease in client.claim("default", worker="w", limit=10):
        client.complete(lease)
    _age(dsn, schema)
    metrics = WorkerMetrics()
    events = WorkerEvents(WorkerStats(), metrics)

    async def once() -> None:
        async with leaseq.AsyncClient(dsn, schema=schema) as aclient:
            service = FairKeyPruner(
                aclient, Outage(), events, retention=60, interval=60, timeout=30
            )
            await service.tick()

    asyncio.run(once())
    assert _keys(dsn, schema) == {""}
    assert metrics.registry.get_sample_value("leaseq_fair_keys_pruned_total") == 5
