"""Batches under chaos: sealed batches of three to six jobs (some fail once, some run
longer than a lease, a few end dead) with on_success, on_failure and on_finish callbacks.

Sampled: no callback exists while a member of its batch is still live. End: every batch
is done and fired each callback once, of the right kind (success when every member
succeeded, failure otherwise; finish always), with the members' true counts; each
callback job exists once and succeeded."""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

import psycopg
from psycopg import sql

import leaseq
from tests.chaos.caps.base import Capability, CapContext

TASK = "chaos.cap"
PER_SECOND = 0.6


class Batches(Capability):
    name = "batches"

    def __init__(self) -> None:
        super().__init__()
        self.members: dict[int, list[int]] = {}

    def enqueue(self, ctx: CapContext) -> None:
        from tests.chaos.app import app

        cb = app.tasks[TASK]
        rng = ctx.rng(self.name)
        client = ctx.client()
        try:
            batches = ctx.count(PER_SECOND)
            specs, owner = [], []
            for b in range(batches):
                on = {
                    kind: cb.sig(ctx.payload(rng, cap="batchcb", expect=kind), max_attempts=25)
                    for kind in ("on_success", "on_failure", "on_finish")
                }
                batch = client.create_batch(
                    on_success=on["on_success"],
                    on_failure=on["on_failure"],
                    on_finish=on["on_finish"],
                )
                for _ in range(rng.randint(3, 6)):
                    roll = rng.random()
                    mode = "poison" if roll < 0.03 else "flaky" if roll < 0.15 else "ok"
                    due = ctx.at(0.85 * (b + rng.random()) / batches)
                    payload = ctx.payload(rng, mode=mode, long_share=0.1, cap="batch")
                    specs.append(
                        leaseq.JobSpec(TASK, payload, run_at=due, max_attempts=25, batch_id=batch)
                    )
                    owner.append(batch)
            for job, batch in zip(client.enqueue_many(specs), owner, strict=True):
                self.members.setdefault(batch, []).append(int(job))
            for batch in self.members:
                client.seal_batch(batch)
        finally:
            client.close()
        self.counts["batches"] = len(self.members)

    def sample(self, ctx: CapContext, conn: psycopg.Connection[Any]) -> list[str]:
        q = sql.SQL(
            "SELECT c.batch_id, c.kind, count(j.id) FROM {c} AS c"
            " JOIN {j} AS j ON j.batch_id = c.batch_id"
            " AND j.status IN ('pending', 'running', 'suspended')"
            " GROUP BY 1, 2"
        ).format(c=ctx.table("batch_callbacks"), j=ctx.table("jobs"))
        return [
            f"batch {b}: {k} callback fired with {n} member(s) live" for b, k, n in conn.execute(q)
        ]

    def final(self, ctx: CapContext, conn: psycopg.Connection[Any]) -> list[str]:
        bad = self.sample(ctx, conn)
        states = dict(
            conn.execute(
                sql.SQL("SELECT id, state FROM {} WHERE id = ANY(%s)").format(ctx.table("batches")),
                (list(self.members),),
            ).fetchall()
        )
        members: dict[int, Counter[str]] = defaultdict(Counter)
        for batch, status, n in conn.execute(
            sql.SQL(
                "SELECT batch_id, status::text, count(*) FROM {} WHERE batch_id = ANY(%s)"
                " GROUP BY 1, 2"
            ).format(ctx.table("jobs")),
            (list(self.members),),
        ):
            members[batch][status] = n
        fired: dict[int, dict[str, int]] = defaultdict(dict)
        for batch, kind, job in conn.execute(
            sql.SQL("SELECT batch_id, kind, job_id FROM {} WHERE batch_id = ANY(%s)").format(
                ctx.table("batch_callbacks")
            ),
            (list(self.members),),
        ):
            fired[batch][kind] = job
        jobs: dict[int, list[tuple[Any, ...]]] = defaultdict(list)
        for row in conn.execute(
            sql.SQL(
                "SELECT (payload->>'batch_id')::bigint, payload->>'kind', id, status::text,"
                " (payload->>'total')::int, (payload->>'succeeded')::int,"
                " payload->'payload'->>'expect'"
                " FROM {} WHERE payload->'payload'->>'cap' = 'batchcb'"
            ).format(ctx.table("jobs"))
        ):
            jobs[row[0]].append(row)
        for batch, ids in self.members.items():
            m = members[batch]
            ok = m["succeeded"] == len(ids)
            self.counts["batches_success" if ok else "batches_failure"] += 1
            if states.get(batch) != "done":
                bad.append(f"batch {batch} is {states.get(batch)}; members {dict(m)}")
            want = {"success" if ok else "failure", "finish"}
            if set(fired[batch]) != want:
                bad.append(f"batch {batch} (members {dict(m)}) fired {sorted(fired[batch])}")
            kinds = Counter(r[1] for r in jobs[batch])
            if set(kinds) != set(fired[batch]) or any(n != 1 for n in kinds.values()):
                bad.append(
                    f"batch {batch}: callback jobs {dict(kinds)}, fired {sorted(fired[batch])}"
                )
            for _, kind, job, status, total, succeeded, expect in jobs[batch]:
                self.counts["callbacks"] += 1
                if expect != f"on_{kind}":
                    bad.append(f"batch {batch}: the {kind} callback job {job} runs {expect}")
                if (total, succeeded) != (len(ids), m["succeeded"]):
                    bad.append(
                        f"batch {batch}: {kind} callback counted {succeeded}/{total}, "
                        f"members {dict(m)}"
                    )
                if status != "succeeded":
                    bad.append(f"batch {batch}: {kind} callback job {job} ended {status}")
        return bad
