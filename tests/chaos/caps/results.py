"""Stored results under chaos: a task with ``store_result=True`` returns the token it ran
under (some attempts fail once, some run longer than a lease and lose it while running).

Sampled: a stored result exists only for a succeeded job, under its final token. End:
every succeeded job has its result, written under the job's final token by the execution
that held it (the value names that token); no other job has one."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql

import leaseq
from tests.chaos.caps.base import Capability, CapContext

TASK = "chaos.cap.result"
PER_SECOND = 4.0


class Results(Capability):
    name = "results"

    def enqueue(self, ctx: CapContext) -> None:
        rng = ctx.rng(self.name)
        specs = []
        jobs = ctx.count(PER_SECOND)
        for i in range(jobs):
            mode = "flaky" if rng.random() < 0.1 else "ok"
            payload = ctx.payload(rng, mode=mode, long_share=0.15, cap="results")
            specs.append(
                leaseq.JobSpec(TASK, payload, run_at=ctx.at(0.9 * i / jobs), max_attempts=25)
            )
        client = ctx.client()
        try:
            client.enqueue_many(specs)
        finally:
            client.close()
        self.counts["jobs"] = jobs

    def _rows(self, ctx: CapContext, conn: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
        return conn.execute(
            sql.SQL(
                "SELECT j.id, j.status::text, j.lease_token, r.lease_token,"
                " (r.value->>'token')::bigint"
                " FROM {j} AS j LEFT JOIN {r} AS r ON r.job_id = j.id WHERE j.task = %s"
            ).format(j=ctx.table("jobs"), r=ctx.table("job_results")),
            (TASK,),
        ).fetchall()

    def sample(self, ctx: CapContext, conn: psycopg.Connection[Any]) -> list[str]:
        bad = []
        for job, status, token, stored, value in self._rows(ctx, conn):
            if stored is None:
                continue
            if status != "succeeded":
                bad.append(f"job {job} is {status} but has a result (token {stored})")
            elif stored != token or value != token:
                bad.append(f"job {job}: final token {token}, result stored under {stored}/{value}")
        return bad

    def final(self, ctx: CapContext, conn: psycopg.Connection[Any]) -> list[str]:
        bad = self.sample(ctx, conn)
        rows = self._rows(ctx, conn)
        for job, status, _token, stored, _value in rows:
            self.counts[f"jobs_{status}"] += 1
            if status == "succeeded" and stored is None:
                bad.append(f"succeeded job {job} has no stored result")
        if len(rows) != self.counts["jobs"]:
            bad.append(f"{self.counts['jobs']} result jobs enqueued, {len(rows)} found")
        returned = {(ex.job, ex.token) for ex in ctx.executions() if ex.outcome == "returned"}
        for job, status, token, _stored, _value in rows:
            if status == "succeeded" and (job, token) not in returned:
                bad.append(f"job {job}: no execution under its final token {token} returned")
        self.counts["stored"] = sum(1 for r in rows if r[3] is not None)
        self.counts["claimed_more_than_once"] = sum(1 for r in rows if r[2] > 1)
        return bad
