"""procrastinate as a peer: ``python -P -m bench.peers procrastinate setup|drain``.

Configuration, as procrastinate documents it: a ``PsycopgConnector`` (psycopg 3 and
psycopg_pool, the connector's default pool size) whose connections get ``options=-c
search_path=<schema>`` ("Set the database PG schema" in procrastinate's how-to), so its
tables, types and functions live in the benchmark's schema and not in ``public``.
``setup`` applies procrastinate's schema with ``app.schema_manager.apply_schema_async()``
(what ``procrastinate schema --apply`` runs) into that schema, which the benchmark has
created, and enqueues with ``Task.batch_defer_async`` (procrastinate's bulk defer; one
statement per chunk). ``drain`` runs ``app.run_worker_async(concurrency=C, wait=False)``
(the worker stops once it finds no job, like ``procrastinate worker --one-shot``) under
``asyncio.run``, as procrastinate's CLI does. procrastinate has no claim batch: each
sub-worker fetches one job per statement, so only the concurrency is set.

Finished jobs stay in ``procrastinate_jobs`` with status ``succeeded`` (the default
``delete_jobs="never"``); the benchmark counts them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

import procrastinate  # type: ignore[import-not-found,unused-ignore]

from bench.peers import ENQUEUE_CHUNK, dsn, parse, report

TASK = "noop"
QUEUE = "default"
APPLICATION_NAME = "leaseq-bench-procrastinate"


class Peer:
    """A procrastinate App on one schema, with the counting no-op task."""

    def __init__(self, schema: str) -> None:
        self.processed = 0
        connector = procrastinate.PsycopgConnector(
            conninfo=dsn(),
            kwargs={"options": f"-c search_path={schema}", "application_name": APPLICATION_NAME},
        )
        self.app = procrastinate.App(connector=connector)
        self.task = self.app.task(name=TASK, queue=QUEUE)(self.noop)

    async def noop(self, n: int) -> None:
        """The no-op task; it only counts (the benchmark checks the table too)."""
        self.processed += 1


async def setup(schema: str, jobs: int) -> None:
    peer = Peer(schema)
    async with peer.app.open_async():
        await peer.app.schema_manager.apply_schema_async()
        for start in range(0, jobs, ENQUEUE_CHUNK):
            count = min(ENQUEUE_CHUNK, jobs - start)
            specs: list[dict[str, Any]] = [{"n": start + i} for i in range(count)]
            await peer.task.batch_defer_async(*specs)


async def drain(schema: str, concurrency: int) -> int:
    peer = Peer(schema)
    async with peer.app.open_async():
        await peer.app.run_worker_async(concurrency=concurrency, wait=False)
    return peer.processed


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv, "python -m bench.peers procrastinate")
    if args.command == "setup":
        asyncio.run(setup(args.schema, args.jobs))
        return 0
    started = time.perf_counter()
    processed = asyncio.run(drain(args.schema, args.concurrency))
    report(processed, time.perf_counter() - started)
    return 0
