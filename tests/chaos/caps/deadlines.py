"""Start deadlines under chaos: jobs due over the window with ``expires=`` a little after
they are due (an aware datetime), so a restart, a stopped worker or a retry's back-off makes
some of them late; some fail once.

Sampled: no job of the capability is running or succeeded with ``started_at`` at or after
its ``expires_at`` (the claim must refuse it). End: each job succeeded, or ended cancelled
with EXPIRED and exactly one ``expired`` event; none is left pending, none ended otherwise."""

from __future__ import annotations

import datetime as dt
from collections import Counter
from typing import Any

import psycopg
from psycopg import sql

import leaseq
from tests.chaos.caps.base import Capability, CapContext

TASK = "chaos.cap"
PER_SECOND = 3.0


class Deadlines(Capability):
    name = "deadlines"

    def enqueue(self, ctx: CapContext) -> None:
        rng = ctx.rng(self.name)
        specs = []
        jobs = ctx.count(PER_SECOND)
        for i in range(jobs):
            mode = "flaky" if rng.random() < 0.15 else "ok"
            due = ctx.at(0.9 * i / jobs)
            expires = due + dt.timedelta(seconds=rng.uniform(2.0, 40.0))
            payload = ctx.payload(rng, work=(0.05, 0.3), long_share=0.05, mode=mode, cap="expires")
            specs.append(
                leaseq.JobSpec(TASK, payload, run_at=due, expires=expires, max_attempts=25)
            )
        client = ctx.client()
        try:
            client.enqueue_many(specs)
        finally:
            client.close()
        self.counts["jobs"] = jobs

    def sample(self, ctx: CapContext, conn: psycopg.Connection[Any]) -> list[str]:
        q = sql.SQL(
            "SELECT id, status::text, started_at - expires_at FROM {}"
            " WHERE payload->>'cap' = 'expires' AND status IN ('running', 'succeeded')"
            " AND started_at >= expires_at"
        ).format(ctx.table("jobs"))
        return [
            f"job {j} is {s}, started {late} after its deadline" for j, s, late in conn.execute(q)
        ]

    def final(self, ctx: CapContext, conn: psycopg.Connection[Any]) -> list[str]:
        bad = self.sample(ctx, conn)
        rows = conn.execute(
            sql.SQL(
                "SELECT j.id, j.status::text, j.last_error_code, j.attempt_count,"
                " (SELECT count(*) FROM {e} AS e WHERE e.job_id = j.id AND e.event = 'expired')"
                " FROM {j} AS j WHERE j.payload->>'cap' = 'expires'"
            ).format(e=ctx.table("job_events"), j=ctx.table("jobs"))
        ).fetchall()
        outcomes: Counter[str] = Counter()
        for job, status, code, attempts, expired in rows:
            ended = f"{status}_{code}" if status != "succeeded" else status
            outcomes[ended] += 1
            if status == "cancelled" and code == "EXPIRED":
                if expired != 1:
                    bad.append(f"job {job}: cancelled EXPIRED with {expired} 'expired' events")
                if attempts:
                    outcomes["expired_after_an_attempt"] += 1
            elif status != "succeeded":
                bad.append(f"job {job} ended {status} ({code})")
            elif expired:
                bad.append(f"job {job} succeeded but has {expired} 'expired' event(s)")
        ((p50, p90),) = conn.execute(
            sql.SQL(
                "SELECT percentile_disc(0.5) WITHIN GROUP (ORDER BY x),"
                " percentile_disc(0.9) WITHIN GROUP (ORDER BY x) FROM (SELECT"
                " extract(epoch FROM finished_at - available_at) * 1000 AS x FROM {}"
                " WHERE payload->>'cap' = 'expires' AND status = 'succeeded') AS t"
            ).format(ctx.table("jobs"))
        )
        self.counts["due_to_done_ms_p50"] = round(p50 or 0)
        self.counts["due_to_done_ms_p90"] = round(p90 or 0)
        if len(rows) != self.counts["jobs"]:
            bad.append(f"{self.counts['jobs']} jobs with a deadline enqueued, {len(rows)} found")
        self.counts.update(outcomes)
        return bad
