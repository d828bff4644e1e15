"""Durable steps under chaos: a task of three steps, each writing one ledger row through
``ctx.transaction()`` inside the step (so the row commits with the step's record or not at
all), with work between the steps, so faults land before, between and after them.

Sampled: no (job, step) has two ledger rows. End: every job succeeded (or used up its
attempts), each of its steps has exactly one ledger row and one record in ``job_steps``,
the row was written under a token the job reached, and no step is missing."""

from __future__ import annotations

from collections import Counter
from typing import Any

import psycopg
from psycopg import sql

import leaseq
from tests.chaos.app import STEPS, STEPS_TABLE, steps_ddl
from tests.chaos.caps.base import Capability, CapContext

TASK = "chaos.cap.steps"
PER_SECOND = 2.0


class Steps(Capability):
    name = "steps"

    def setup(self, ctx: CapContext) -> None:
        with psycopg.connect(ctx.dsn, autocommit=True) as conn:
            conn.execute(steps_ddl(ctx.schema))

    def enqueue(self, ctx: CapContext) -> None:
        rng = ctx.rng(self.name)
        specs = []
        jobs = ctx.count(PER_SECOND)
        for i in range(jobs):
            mode = "flaky" if rng.random() < 0.1 else "ok"
            payload = ctx.payload(rng, work=(0.05, 0.3), long_share=0.05, mode=mode, cap="steps")
            specs.append(
                leaseq.JobSpec(TASK, payload, run_at=ctx.at(0.9 * i / jobs), max_attempts=25)
            )
        client = ctx.client()
        try:
            client.enqueue_many(specs)
        finally:
            client.close()
        self.counts["jobs"] = jobs

    def sample(self, ctx: CapContext, conn: psycopg.Connection[Any]) -> list[str]:
        q = sql.SQL(
            "SELECT job_id, step, array_agg(token ORDER BY written_at) FROM {}"
            " GROUP BY 1, 2 HAVING count(*) > 1"
        ).format(ctx.table(STEPS_TABLE))
        return [
            f"job {job}: step {step} ran {len(tokens)} times (tokens {tokens})"
            for job, step, tokens in conn.execute(q)
        ]

    def final(self, ctx: CapContext, conn: psycopg.Connection[Any]) -> list[str]:
        bad = self.sample(ctx, conn)
        jobs = conn.execute(
            sql.SQL(
                "SELECT id, status::text, lease_token, last_error_code FROM {} WHERE task = %s"
            ).format(ctx.table("jobs")),
            (TASK,),
        ).fetchall()
        ledger: Counter[tuple[int, str]] = Counter()
        tokens: dict[int, int] = {}
        for job, step, token in conn.execute(
            sql.SQL("SELECT job_id, step, token FROM {} WHERE step = ANY(%s)").format(
                ctx.table(STEPS_TABLE)
            ),
            (list(STEPS),),
        ):
            ledger[job, step] += 1
            tokens[job] = max(token, tokens.get(job, 0))
        records: Counter[tuple[int, str]] = Counter(
            (job, step)
            for job, step in conn.execute(
                sql.SQL("SELECT job_id, name FROM {}").format(ctx.table("job_steps"))
            )
        )
        if len(jobs) != self.counts["jobs"]:
            bad.append(f"{self.counts['jobs']} step jobs enqueued, {len(jobs)} found")
        for job, status, token, code in jobs:
            self.counts[f"jobs_{status}"] += 1
            if status != "succeeded":
                bad.append(f"step job {job} ended {status} ({code})")
                continue
            for step in STEPS:
                if ledger[job, step] != 1 or records[job, step] != 1:
                    bad.append(
                        f"job {job}: step {step} has {ledger[job, step]} ledger row(s) and "
                        f"{records[job, step]} record(s)"
                    )
            if tokens.get(job, 0) > token:
                bad.append(f"job {job}: a step written under token {tokens[job]} > final {token}")
            if token > 1:
                self.counts["resumed_after_a_fault"] += 1
        self.counts["ledger_rows"] = sum(ledger.values())
        return bad
