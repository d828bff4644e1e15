"""A worker whose claims are sized by the measured round trip (``adaptive_batch``): the
boundary is the claim statement's LIMIT and the slot cap, which grow past ``batch_size``
(and the concurrency, by up to one claim of prefetch). Every job must still be claimed
under a lease of its own and ended once through the fenced completion; a queue with its
own ``batch=N`` keeps that size."""

from __future__ import annotations

import asyncio
from typing import Any

import leaseq
from leaseq.worker.config import QueueSettings

JOBS = 3000
BATCH = 10
CONCURRENCY = 50


def claim_sizes(client: leaseq.Client, queue: str) -> list[int]:
    """Jobs per claim statement: the jobs one claim took share its transaction's now()."""
    with client.connection() as conn:
        rows = conn.execute(
            f'SELECT count(*) FROM "{client.schema}".jobs WHERE queue_name = %s '
            "GROUP BY started_at ORDER BY started_at",
            (queue,),
        ).fetchall()
    return [int(r[0]) for r in rows]


def ended_once(client: leaseq.Client, queue: str) -> tuple[int, int]:
    with client.connection() as conn:
        row = conn.execute(
            f"SELECT count(*) FILTER (WHERE status = 'succeeded' AND attempt_count = 1 "
            "AND lease_token = 1 AND lease_owner IS NULL AND finished_at >= started_at), "
            f'count(*) FROM "{client.schema}".jobs WHERE queue_name = %s',
            (queue,),
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


async def test_adaptive_claims_grow_past_the_batch_size_and_every_job_ends_once(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    app = leaseq.App(dsn, schema=schema)

    @app.task(name="noop_adaptive", queue="default")
    async def noop_adaptive(ctx: leaseq.JobContext, payload: Any) -> None:
        return None

    client.enqueue_many([{"task": "noop_adaptive", "queue": "default"}] * JOBS)
    client.enqueue_many([{"task": "noop_adaptive", "queue": "fixed"}] * 200)
    config = leaseq.WorkerConfig(
        queues=("default", QueueSettings("fixed", batch_size=7)),
        batch_size=BATCH,
        concurrency=CONCURRENCY,
        adaptive_batch=True,
        poll_interval=0.05,
        burst=True,
    )
    stats = await asyncio.wait_for(leaseq.Worker(app, config).run(), 120)
    assert stats.succeeded == JOBS + 200
    assert ended_once(client, "default") == (JOBS, JOBS)
    assert ended_once(client, "fixed") == (200, 200)
    sizes = claim_sizes(client, "default")
    assert sum(sizes) == JOBS
    assert max(sizes) > BATCH  # sized by the round trip, not by batch_size
    assert max(sizes) <= 2 * CONCURRENCY  # slots plus at most one claim of prefetch
    assert max(claim_sizes(client, "fixed")) <= 7  # a queue's own batch stays fixed
