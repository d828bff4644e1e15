"""fair_keys is vacuumed by the workers (vacuum_fair_keys, the worker's FairKeyVacuum) on a
real PostgreSQL. The boundary: each claim of a fair queue moves the passes of the keys it
takes from, which leaves their old entries at the low end of fair_keys_pass_idx, where the
next claim's scan starts. Counted in buffers, not time: the scan reads every page of them
until a vacuum, and none after it; the vacuum never waits for another one; and the claims
after it go on in turn."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time

import psycopg
import pytest

import leaseq
from leaseq.metrics import WorkerMetrics
from leaseq.worker.inflight import WorkerEvents, WorkerStats
from leaseq.worker.maintenance import FAIR_VACUUM_DEAD, FairKeyVacuum
from leaseq.worker.outage import Outage
from tests.support.helpers import rows, run_sql

KEYS = 300


def _fill_and_claim(dsn: str, schema: str, claims: int) -> None:
    """Jobs of KEYS keys, then ``claims`` claims of 10, completed, on a client of their own:
    closing it ends its sessions, which flushes their statistics (a session left open
    flushes them only when it has been idle a while). Autovacuum is kept off this schema's
    fair_keys first, so that only the vacuums under test run."""
    run_sql(dsn, "ALTER TABLE {s}.fair_keys SET (autovacuum_enabled = false)", schema)
    with leaseq.Client(dsn, schema=schema) as own:
        own.enqueue_many(
            [{"task": "t", "fairness_key": f"k{i % KEYS:03d}"} for i in range(KEYS * 8)]
        )
        for _ in range(claims):
            leases = own.claim("default", worker="w", limit=10)
            assert len(leases) == 10
            own.complete_many(leases)


def _dead(dsn: str, schema: str) -> int:
    ((n,),) = rows(
        dsn,
        "SELECT coalesce(n_dead_tup, 0) FROM pg_stat_user_tables "
        "WHERE relid = '{s}.fair_keys'::regclass",
        schema,
    )
    return int(n)


def _wait_dead(dsn: str, schema: str, at_least: int) -> int:
    """The statistics of the claims' backends are flushed within a second or so of their
    last transaction: wait for them."""
    deadline = time.monotonic() + 30
    while (n := _dead(dsn, schema)) < at_least:
        assert time.monotonic() < deadline, f"fair_keys shows {n} dead rows, not {at_least}"
        time.sleep(0.1)
    return n


def _vacuums(dsn: str, schema: str) -> int:
    ((n,),) = rows(
        dsn,
        "SELECT vacuum_count FROM pg_stat_user_tables WHERE relid = '{s}.fair_keys'::regclass",
        schema,
    )
    return int(n)


def _until_removed(client: leaseq.Client, dsn: str, schema: str) -> None:
    """Vacuum again while dead rows remain: a snapshot another session (another test) holds
    open keeps them for a moment, and a vacuum counts them as dead but not yet removable."""
    deadline = time.monotonic() + 60
    while _dead(dsn, schema):
        assert time.monotonic() < deadline, f"{_dead(dsn, schema)} dead rows stay"
        time.sleep(0.2)
        client.vacuum_fair_keys(min_dead=1)


def _turn_scan_buffers(dsn: str, schema: str) -> int:
    """Buffers the claim's scan of the keys in turn (k0's first branch) reads for its
    first 18 keys: the dead entries of earlier passes before them included."""
    plan = rows(
        dsn,
        "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) SELECT f.fairness_key FROM {s}.fair_keys AS f "
        "WHERE f.queue_name = 'default' AND f.parked_until IS NULL "
        "ORDER BY f.pass NULLS FIRST LIMIT 18",
        schema,
    )[0][0][0]["Plan"]
    return int(plan["Shared Hit Blocks"]) + int(plan["Shared Read Blocks"])


def test_a_vacuum_removes_the_dead_pass_entries_the_claims_step_over(
    client: leaseq.Client, dsn: str, schema: str
) -> None:
    _fill_and_claim(dsn, schema, 150)  # 1,500 passes moved
    _wait_dead(dsn, schema, FAIR_VACUUM_DEAD)
    _turn_scan_buffers(dsn, schema)  # marks the dead entries it meets (kill bits)
    before = _turn_scan_buffers(dsn, schema)
    assert client.vacuum_fair_keys(min_dead=FAIR_VACUUM_DEAD)
    _until_removed(client, dsn, schema)
    after = _turn_scan_buffers(dsn, schema)
    # 1,500 dead entries fill several leaf pages; after the vacuum the scan reads the
    # root, one leaf and the heap pages of its 18 rows.
    assert before - after >= 5, (before, after)
    assert after <= 5, after
    assert not client.vacuum_fair_keys(min_dead=FAIR_VACUUM_DEAD)
    # The rotation goes on where it was: the next claim takes one job from each of ten keys.
    leases = client.claim("default", worker="w", limit=10)
    got = rows(
        dsn,
        "SELECT count(DISTINCT fairness_key) FROM {s}.jobs WHERE id = ANY(%s)",
        schema,
        [x.job_id for x in leases],
    )
    assert got == [(10,)]


def test_below_the_floor_nothing_is_vacuumed(client: leaseq.Client, dsn: str, schema: str) -> None:
    _fill_and_claim(dsn, schema, 20)  # 200 passes moved
    n = _wait_dead(dsn, schema, 200)
    assert not client.vacuum_fair_keys(min_dead=n + 1)
    assert _dead(dsn, schema) == n
    with pytest.raises(leaseq.LeaseqError):
        client.vacuum_fair_keys(min_dead=-1)


def test_a_vacuum_never_waits_for_another(client: leaseq.Client, dsn: str, schema: str) -> None:
    _fill_and_claim(dsn, schema, 150)
    n = _wait_dead(dsn, schema, FAIR_VACUUM_DEAD)
    returned = threading.Event()
    # Another vacuum's lock (SHARE UPDATE EXCLUSIVE), held open until the call returns: a
    # vacuum that waited for it would never return.
    with psycopg.connect(dsn) as other:
        other.execute(f'LOCK TABLE "{schema}".fair_keys IN SHARE UPDATE EXCLUSIVE MODE')
        caller = threading.Thread(
            target=lambda: (client.vacuum_fair_keys(min_dead=FAIR_VACUUM_DEAD), returned.set())
        )
        caller.start()
        caller.join(timeout=60)
        held = returned.is_set()
        other.rollback()
    caller.join()
    assert held, "vacuum_fair_keys waited for the other vacuum's lock"
    assert _dead(dsn, schema) >= n  # skipped: nothing was removed


def test_the_worker_service_vacuums_and_counts_on_a_connection_of_its_own(
    client: leaseq.Client, dsn: str, schema: str
) -> None:
    metrics = WorkerMetrics()
    events = WorkerEvents(WorkerStats(), metrics)

    def vacuums() -> float | None:
        return metrics.registry.get_sample_value("leaseq_fair_keys_vacuums_total")

    async def serve(claim_fair: bool, until: float) -> tuple[int, int]:
        """Run the service for two looks at least, until it has vacuumed ``until`` times,
        in a worker whose client has (or has not) claimed the fair queue. Returns the
        pool's connections before and after the service ran."""
        async with leaseq.AsyncClient(dsn, schema=schema) as aclient:
            if claim_fair:
                await aclient.complete_many(await aclient.claim("default", worker="w"))
            before = sum(aclient.pool_stats().values())
            task = asyncio.create_task(FairKeyVacuum(aclient, Outage(), events, timeout=30).run())
            started = time.monotonic()
            while vacuums() != until or time.monotonic() < started + 2:
                assert time.monotonic() < started + 30, f"{vacuums()} vacuums, not {until}"
                await asyncio.sleep(0.05)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            return before, sum(aclient.pool_stats().values())

    _fill_and_claim(dsn, schema, 150)
    _wait_dead(dsn, schema, FAIR_VACUUM_DEAD)
    # A worker of plain queues asks nothing, however many dead rows there are: the pool is
    # never opened.
    assert asyncio.run(serve(False, 0)) == (0, 0)
    assert _vacuums(dsn, schema) == 0
    # A worker that claims the fair queue vacuums it, on a connection of its own (the
    # pool keeps the one connection its claim opened).
    before, after = asyncio.run(serve(True, 1))
    assert after == before
    assert _vacuums(dsn, schema) == 1  # the server's count: the vacuum it asked for
