"""Durable sleep and signals under chaos: jobs that write a step, sleep (suspended: no
lease, no slot), wait for the signal "go" (sent by a thread of the harness at a random
moment, before or after the job waits, once per job), then write a second step and return
the signal's payload.

Sampled: a suspended job holds no lease and no slot (no slot row, no queue slot). End:
every job succeeded with the payload of the one signal sent to it, each of its two steps
has exactly one ledger row, and the signal was stored once."""

from __future__ import annotations

import random
import time
from typing import Any

import psycopg
from psycopg import sql

import leaseq
from tests.chaos.app import STEPS_TABLE, steps_ddl
from tests.chaos.caps.base import Capability, CapContext

TASK = "chaos.cap.waits"
PER_SECOND = 1.0


class Waits(Capability):
    name = "waits"

    def __init__(self) -> None:
        super().__init__()
        self.jobs: list[int] = []
        self.sent: dict[int, int] = {}

    def setup(self, ctx: CapContext) -> None:
        with psycopg.connect(ctx.dsn, autocommit=True) as conn:
            conn.execute(steps_ddl(ctx.schema))

    def enqueue(self, ctx: CapContext) -> None:
        rng = ctx.rng(self.name)
        n = ctx.count(PER_SECOND)
        specs = [
            leaseq.JobSpec(
                TASK,
                ctx.payload(rng, cap="waits", sleep=round(rng.uniform(0.2, 2.0), 3)),
                run_at=ctx.at(0.8 * i / n),
                max_attempts=25,
            )
            for i in range(n)
        ]
        client = ctx.client()
        try:
            self.jobs = [int(j) for j in client.enqueue_many(specs)]
        finally:
            client.close()
        self.counts["jobs"] = n

    def produce(self, ctx: CapContext) -> None:
        """Each job's signal, at a random moment from its due time on (its index)."""
        rng = random.Random(f"{ctx.seed}:waits:send")
        began = time.monotonic()
        plan = sorted(
            (0.8 * ctx.seconds * i / len(self.jobs) + rng.uniform(-1.0, 3.0), job)
            for i, job in enumerate(self.jobs)
        )
        client = None
        pending = list(plan)
        while pending and not ctx.stop.is_set():
            at, job = pending[0]
            if time.monotonic() - began < at:
                ctx.stop.wait(0.05)
                continue
            try:
                client = client or ctx.client()
                client.signal(job, "go", {"job": job, "n": 1})
                self.sent[job] = 1
                pending.pop(0)
            except Exception:
                self.counts["signal_errors"] += 1
                if client is not None:
                    client.close()
                client = None
                time.sleep(0.2)
        client = client or ctx.client()
        try:  # the window ended: whatever is left is sent now, so every job can finish
            for _, job in pending:
                client.signal(job, "go", {"job": job, "n": 1})
                self.sent[job] = 1
        finally:
            client.close()

    def sample(self, ctx: CapContext, conn: psycopg.Connection[Any]) -> list[str]:
        q = sql.SQL(
            "SELECT j.id, j.lease_owner, j.queue_slot,"
            " (SELECT count(*) FROM {s} AS s WHERE s.job_id = j.id)"
            " FROM {j} AS j WHERE j.task = %s AND j.status = 'suspended'"
            " AND (j.lease_owner IS NOT NULL OR j.queue_slot IS NOT NULL"
            "      OR EXISTS (SELECT 1 FROM {s} AS s WHERE s.job_id = j.id))"
        ).format(s=ctx.table("limit_slots"), j=ctx.table("jobs"))
        return [
            f"suspended job {job} holds lease {owner} / queue slot {slot} / {rows} slot rows"
            for job, owner, slot, rows in conn.execute(q, (TASK,))
        ]

    def final(self, ctx: CapContext, conn: psycopg.Connection[Any]) -> list[str]:
        bad = self.sample(ctx, conn)
        rows = conn.execute(
            sql.SQL(
                "SELECT j.id, j.status::text, j.last_error_code, r.value,"
                " (SELECT count(*) FROM {l} AS l WHERE l.job_id = j.id AND l.step = 'before'),"
                " (SELECT count(*) FROM {l} AS l WHERE l.job_id = j.id AND l.step = 'after'),"
                " (SELECT count(*) FROM {g} AS g WHERE g.job_id = j.id)"
                " FROM {j} AS j LEFT JOIN {r} AS r ON r.job_id = j.id WHERE j.task = %s"
            ).format(
                l=ctx.table(STEPS_TABLE),
                g=ctx.table("job_signals"),
                j=ctx.table("jobs"),
                r=ctx.table("job_results"),
            ),
            (TASK,),
        ).fetchall()
        if len(rows) != len(self.jobs):
            bad.append(f"{len(self.jobs)} waiting jobs enqueued, {len(rows)} found")
        for job, status, code, value, before, after, signals in rows:
            self.counts[f"jobs_{status}"] += 1
            if status != "succeeded":
                bad.append(f"waiting job {job} ended {status} ({code})")
                continue
            if value != {"job": job, "n": 1}:
                bad.append(f"job {job} returned {value!r}, not its signal's payload")
            if (before, after, signals) != (1, 1, 1):
                bad.append(f"job {job}: steps before/after {before}/{after}, signals {signals}")
        ((suspensions,),) = conn.execute(
            sql.SQL(
                "SELECT count(*) FROM {} WHERE job_id = ANY(%s) AND event = 'suspended'"
            ).format(ctx.table("job_events")),
            (self.jobs,),
        )
        self.counts["suspensions"] = suspensions
        return bad
