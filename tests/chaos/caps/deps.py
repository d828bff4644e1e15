"""Dependencies under chaos: fan-ins (a job waiting for one to four parents, some of which
fail once, run longer than a lease, or end dead) and a second step after each.

Sampled: no dependent is claimable, running or done while one of its parents has not
succeeded (on_dead 'cancel'). End: a dependent whose parents all succeeded was promoted
exactly once, succeeded, and no execution of it started before its last parent finished;
one with a dead parent (or behind a cancelled dependent) ended cancelled with
DEPENDENCY_FAILED, never promoted and never run."""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

import psycopg
from psycopg import sql

import leaseq
from tests.chaos.caps.base import Capability, CapContext

TASK = "chaos.cap"
PER_SECOND = 1.0  # groups


class Dependencies(Capability):
    name = "deps"

    def __init__(self) -> None:
        super().__init__()
        self.parents: dict[int, list[int]] = {}

    def enqueue(self, ctx: CapContext) -> None:
        from tests.chaos.app import app

        task = app.tasks[TASK]
        rng = ctx.rng(self.name)
        groups = ctx.count(PER_SECOND)
        shapes: list[int] = []
        flows = []
        for g in range(groups):
            parents = []
            for _ in range(rng.randint(1, 4)):
                roll = rng.random()
                mode = "poison" if roll < 0.04 else "flaky" if roll < 0.15 else "ok"
                due = ctx.at(0.85 * (g + rng.random()) / groups)
                payload = ctx.payload(rng, mode=mode, long_share=0.1, cap="deps", role="parent")
                parents.append(task.sig(payload, run_at=due, max_attempts=25))
            first = task.sig(ctx.payload(rng, cap="deps", role="dependent"), max_attempts=25)
            second = task.sig(ctx.payload(rng, cap="deps", role="second"), max_attempts=25)
            flows.append(leaseq.chain(leaseq.group(*parents), first, second))
            shapes.append(len(parents))
        client = ctx.client()
        try:
            ids: list[int] = []
            for i in range(0, len(flows), 100):  # one transaction per 100 groups
                ids += [int(r) for r in client.enqueue_flow(leaseq.group(*flows[i : i + 100]))]
        finally:
            client.close()
        at = 0
        for n in shapes:  # depth first: the parents, the dependent, the second step
            parents, first, second = ids[at : at + n], ids[at + n], ids[at + n + 1]
            self.parents[first] = parents
            self.parents[second] = [first]
            at += n + 2
        self.counts["dependents"] = len(self.parents)

    def sample(self, ctx: CapContext, conn: psycopg.Connection[Any]) -> list[str]:
        q = sql.SQL(
            "SELECT c.id, c.status::text, p.id, p.status::text FROM {d} AS d"
            " JOIN {j} AS c ON c.id = d.job_id JOIN {j} AS p ON p.id = d.depends_on"
            " WHERE c.payload->>'cap' = 'deps' AND NOT c.waiting"
            " AND c.status IN ('pending', 'running', 'succeeded') AND p.status <> 'succeeded'"
        ).format(d=ctx.table("job_deps"), j=ctx.table("jobs"))
        return [
            f"dependent {c} is {cs} while its parent {p} is {ps}"
            for c, cs, p, ps in conn.execute(q)
        ]

    def final(self, ctx: CapContext, conn: psycopg.Connection[Any]) -> list[str]:
        bad = self.sample(ctx, conn)
        jobs = {
            i: (s, code, fin)
            for i, s, code, fin in conn.execute(
                sql.SQL(
                    "SELECT id, status::text, last_error_code, extract(epoch FROM finished_at)"
                    " FROM {} WHERE payload->>'cap' = 'deps'"
                ).format(ctx.table("jobs"))
            )
        }
        events: dict[int, Counter[str]] = defaultdict(Counter)
        for job, event, n in conn.execute(
            sql.SQL(
                "SELECT job_id, event, count(*) FROM {} WHERE job_id = ANY(%s)"
                " AND event IN ('promoted', 'dependency_failed') GROUP BY 1, 2"
            ).format(ctx.table("job_events")),
            (list(self.parents),),
        ):
            events[job][event] = n
        starts: dict[int, float] = {}
        for ex in ctx.executions():
            starts[ex.job] = min(ex.start, starts.get(ex.job, ex.start))
        for job, parents in self.parents.items():
            status, code, _ = jobs.get(job, ("missing", None, None))
            ended = [jobs.get(p, ("missing", None, None)) for p in parents]
            ev = events.get(job, Counter())
            if all(s == "succeeded" for s, _, _ in ended):
                self.counts["promoted_ok"] += 1
                if status != "succeeded":
                    bad.append(f"dependent {job} ended {status} ({code}); parents succeeded")
                if ev["promoted"] != 1 or ev["dependency_failed"]:
                    bad.append(f"dependent {job}: events {dict(ev)} (one 'promoted' expected)")
                last = max(float(f) for _, _, f in ended)
                if job in starts and starts[job] < last:
                    bad.append(
                        f"dependent {job} started {last - starts[job]:.3f}s before its last "
                        "parent finished"
                    )
            else:
                self.counts["cancelled_by_parent"] += 1
                if status != "cancelled" or code != "DEPENDENCY_FAILED":
                    bad.append(f"dependent {job} ended {status} ({code}); a parent did not succeed")
                if ev["promoted"]:
                    bad.append(f"dependent {job} promoted though a parent did not succeed")
                if job in starts:
                    bad.append(f"dependent {job} ran though a parent did not succeed")
        for job, (status, code, _) in jobs.items():
            if job not in self.parents:
                self.counts[f"parents_{status}"] += 1
                if status not in ("succeeded", "dead") or (
                    status == "dead" and code != "CHAOS_POISON"
                ):
                    bad.append(f"parent {job} ended {status} ({code})")
        return bad
