"""The worker's hot path: its statements as PostgreSQL runs them on the worker's own
connections (no plan step may cost more than the few index pages a claim reads), and the
process-wide settings a worker process runs under."""

from __future__ import annotations

import gc
import json

import leaseq
from leaseq.sql import Queries


async def test_claim_is_never_jit_compiled_on_the_worker_connections(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    """The boundary: the claim's generic plan is costed for an unknown LIMIT over the whole
    table, so with enough pending jobs (about 30,000) its estimate passes jit_above_cost
    and PostgreSQL compiled the plan before every claim: 10-300 ms per claim instead of
    1-2 ms. Here the threshold is dropped to 0 (as a large table would make the estimate
    cross it): a worker connection must still run the claim without JIT."""
    client.enqueue_many(leaseq.JobSpec("noop", {"n": i}) for i in range(5))
    worker = leaseq.Worker(leaseq.App(dsn, schema=schema))
    params = {
        "queue": "default",
        "owner": "w:plan",
        "lease_seconds": 30.0,
        "limit": 5,
    }
    try:
        async with worker.client.connection() as conn:
            assert await (await conn.execute("SHOW jit")).fetchone() == ("off",)
            await conn.execute("SET jit_above_cost = 0")
            cur = await conn.execute(
                "EXPLAIN (ANALYZE, FORMAT JSON) " + Queries(schema)["claim_jobs"], params
            )
            row = await cur.fetchone()
    finally:
        await worker.client.close()
    assert row is not None
    plan = row[0] if isinstance(row[0], list) else json.loads(row[0])
    assert plan[0]["Plan"]["Actual Rows"] == 5  # the claim ran, and took the jobs
    assert "JIT" not in plan[0]


def test_worker_process_runs_with_a_tuned_collector_and_puts_it_back(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    """The boundary: a drain allocates a dozen tracked objects per job, and Python's default
    collector (a young collection every 700 allocations, full ones walking every object
    the imports left) took a quarter of a worker's CPU. While run_worker runs, start-up
    objects are frozen and young collections are rarer; afterwards the process gets its
    collector back as it was (run_worker is a library call too: Django's command uses it)."""
    before = (gc.get_threshold(), gc.get_freeze_count())
    seen: list[tuple[int, int]] = []

    async def on_ready(worker: leaseq.Worker) -> None:
        seen.append((gc.get_threshold()[0], gc.get_freeze_count()))

    config = leaseq.WorkerConfig(burst=True, poll_interval=0.05)
    stats = leaseq.run_worker(
        leaseq.App(dsn, schema=schema), config, install_signal_handlers=False, on_ready=on_ready
    )
    assert stats.claimed == 0
    (threshold, frozen) = seen[0]
    assert threshold >= 10_000 and frozen > 0
    assert (gc.get_threshold(), gc.get_freeze_count()) == before
