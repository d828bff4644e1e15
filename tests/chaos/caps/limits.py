"""Concurrency limits under chaos: a task limit, a key family, a queue limit (its slots
on the job rows), and a task limit that a thread of the harness sets and removes over and
over during the window (a limit created or dropped while claims are in flight); every 7-14
s the task limit and the key family are removed for 0.5-2.5 s too, so that at times
no task or key limit exists at all.

Jobs have costs (issue 32: 1 to 3, at most the limit's concurrency), so everything is
judged in units. Sampled (one snapshot each): never more units held of any limit than its
concurrency (slot rows and queue slots on job rows, whoever holds them), nor more units
running under a fixed limit (the running jobs' costs) than its concurrency; every running job
under a fixed task or key limit holds exactly its cost in slot rows of its lease, and under
the queue limit its cost in units (a queue slot on its row, or slot rows once the limit's
slots moved there); every slot row belongs to a running lease (same job, same token).
The first two hold a job to a task or key limit only when its lease was claimed, on the
database's clock, at least CLAIM_MARGIN after the limit's row
was written: a job claimed in a gap takes no slot and is not counted, however long it
runs. End: no slot row and no queue slot left held, nothing lost."""

from __future__ import annotations

import math
import time
from typing import Any

import psycopg
from psycopg import sql

from tests.chaos.app import CAP_QUEUE, LIMITED_QUEUE
from tests.chaos.caps.base import Capability, CapContext

TASK_LIMIT = ("task:chaos.cap.limited", 3)
KEY_FAMILY = ("key:chaos-tenant:*", 2)
QUEUE_LIMIT = (f"queue:{CAP_QUEUE}", 4)
FLAP = ("task:chaos.cap.flap", 2)
TENANTS = ("a", "b", "c")
#: The costs drawn for each task's jobs (each at most its limit's concurrency).
COSTS = {
    "chaos.cap.limited": (1, 1, 2, 3),
    "chaos.cap.tenant": (1, 1, 2),
    "chaos.cap.queued": (1, 1, 2, 3),
    "chaos.cap.flap": (1, 2),
}
#: The tasks under a limit, with the concurrency their jobs share.
TASKS = {
    "chaos.cap.limited": TASK_LIMIT[1],
    "chaos.cap.tenant": KEY_FAMILY[1] * len(TENANTS),
    "chaos.cap.queued": QUEUE_LIMIT[1],
    "chaos.cap.flap": FLAP[1],
}
WORK = (0.05, 0.25)
#: Now and then the fixed task and key limits are removed for a moment, so that with the
#: flapping one also gone no task or key limit exists at all (a claim then takes no slot
#: rows, and one that meets a limit created meanwhile must still give its rows back).
GAP_EVERY = (7.0, 14.0)
GAP_LENGTH = (0.5, 2.5)
#: A claim that started this long after a limit's row was written saw the row (its
#: statement's snapshot came after the row's commit): the set_limit transaction is short.
CLAIM_MARGIN = 1.0
LOAD = 0.3  # of what the limit lets through over the window, so the backlog stays short


class Limits(Capability):
    name = "limits"

    def setup(self, ctx: CapContext) -> None:
        client = ctx.client()
        try:
            for name, n in (TASK_LIMIT, KEY_FAMILY, QUEUE_LIMIT):
                client.set_limit(name, concurrency=n, actor="chaos", reason="chaos run")
        finally:
            client.close()

    def enqueue(self, ctx: CapContext) -> None:
        import leaseq

        rng = ctx.rng(self.name)
        specs = []
        for task, concurrency in TASKS.items():
            mean_cost = sum(COSTS[task]) / len(COSTS[task])
            n = max(10, int(LOAD * ctx.seconds * concurrency / (sum(WORK) / 2) / mean_cost))
            for i in range(n):
                opts: dict[str, Any] = {
                    "run_at": ctx.at(0.9 * i / n),
                    "max_attempts": 25,
                    "cost": rng.choice(COSTS[task]),
                }
                if task == "chaos.cap.tenant":
                    opts["limit_key"] = f"chaos-tenant:{TENANTS[i % len(TENANTS)]}"
                opts["queue"] = CAP_QUEUE if task == "chaos.cap.queued" else LIMITED_QUEUE
                mode = "flaky" if rng.random() < 0.05 else "ok"
                payload = ctx.payload(rng, work=WORK, long_share=0.02, mode=mode, cap="limits")
                specs.append(leaseq.JobSpec(task, payload, **opts))
        client = ctx.client()
        try:
            client.enqueue_many(specs)
        finally:
            client.close()
        self.counts["jobs"] = len(specs)

    def __init__(self) -> None:
        super().__init__()
        #: Since when (monotonic) the fixed task and key limits have been set without a gap;
        #: None during a gap (the producer's schedule of gaps; the sampled checks judge
        #: each job by its claim time against the limit's row, on the database's clock).
        self.since: float | None = -math.inf  # set in setup, before any claim

    def _gap(self, client: Any, open_: bool) -> None:
        for name, n in (TASK_LIMIT, KEY_FAMILY):
            if open_:
                client.remove_limit(name, actor="chaos", reason="gap")
            else:
                client.set_limit(name, concurrency=n, actor="chaos", reason="gap over")
        self.since = None if open_ else time.monotonic()
        self.counts["gaps"] += open_

    def produce(self, ctx: CapContext) -> None:
        rng = ctx.rng(f"{self.name}:flap")
        client = None
        on = False
        next_gap = time.monotonic() + rng.uniform(*GAP_EVERY)
        gap_ends: float | None = None
        while not ctx.stop.wait(
            rng.uniform(0.02, 0.2) if self.since is None else rng.uniform(0.05, 0.6)
        ):
            try:
                if client is None:
                    client = ctx.client()
                now = time.monotonic()
                if gap_ends is None and now >= next_gap:
                    self._gap(client, True)
                    gap_ends = now + rng.uniform(*GAP_LENGTH)
                elif gap_ends is not None and now >= gap_ends:
                    self._gap(client, False)
                    gap_ends, next_gap = None, now + rng.uniform(*GAP_EVERY)
                if on:
                    client.remove_limit(FLAP[0], actor="chaos", reason="flap")
                else:
                    client.set_limit(FLAP[0], concurrency=FLAP[1], actor="chaos", reason="flap")
                on = not on
                self.counts["flaps"] += 1
            except Exception:
                self.counts["flap_errors"] += 1
                if client is not None:
                    client.close()
                client = None
                time.sleep(0.2)
        client = client or ctx.client()
        try:  # end with every limit set: their slot rows must all have been given back
            if not on:
                client.set_limit(FLAP[0], concurrency=FLAP[1], actor="chaos", reason="flap")
            if self.since is None:
                self._gap(client, False)
        finally:
            client.close()

    def sample(self, ctx: CapContext, conn: psycopg.Connection[Any]) -> list[str]:
        # A job is held to a task or key limit only if its lease was claimed while the
        # limit's row existed: claimed at least CLAIM_MARGIN after the row was written, on
        # the database's clock (a claim whose snapshot predates the row's commit rightly
        # takes no slot; docs/limits.md, "A new limit"). Such jobs must hold a slot row of
        # their lease, and never more of them run than the limit. A job claimed in a gap
        # runs on without a slot however long it takes, and is not counted.
        j, s, lim_t = ctx.table("jobs"), ctx.table("limit_slots"), ctx.table("limits")
        q = sql.SQL(
            "SELECT x.lim, coalesce(sum(x.cost) FILTER (WHERE x.held), 0),"
            " count(*) FILTER (WHERE x.held AND x.units <> x.cost) FROM ("
            " SELECT y.*, (SELECT count(*) FROM {s} AS s WHERE s.job_id = y.id"
            "   AND s.lease_token = y.lease_token AND s.limit_name = y.lim)"
            "  + (y.queue_slot IS NOT NULL AND left(y.lim, 6) = 'queue:')::int AS units"
            " FROM (SELECT j.id, j.lease_token, j.queue_slot, j.cost,"
            "  CASE WHEN j.queue_name = %(queue)s THEN 'queue:' || j.queue_name"
            "  WHEN j.task = 'chaos.cap.limited' THEN 'task:' || j.task"
            "  ELSE 'key:' || j.limit_key END AS lim,"
            " (j.queue_name = %(queue)s OR EXISTS (SELECT 1 FROM {l} AS l"
            "   WHERE l.name = CASE WHEN j.task = 'chaos.cap.limited' THEN 'task:' || j.task"
            "                  ELSE %(family)s END"
            "   AND j.started_at >= l.updated_at + %(margin)s * interval '1 second')) AS held"
            " FROM {j} AS j WHERE j.status = 'running' AND (j.queue_name = %(queue)s"
            "  OR j.task = 'chaos.cap.limited' OR j.limit_key LIKE 'chaos-tenant:%%')) AS y"
            " ) AS x GROUP BY 1"
        ).format(s=s, j=j, l=lim_t)
        caps = {TASK_LIMIT[0]: TASK_LIMIT[1], QUEUE_LIMIT[0]: QUEUE_LIMIT[1], FLAP[0]: FLAP[1]}
        bad = []
        params = {"queue": CAP_QUEUE, "family": KEY_FAMILY[0], "margin": CLAIM_MARGIN}
        for lim, running, unslotted in conn.execute(q, params):
            cap = caps.get(lim, KEY_FAMILY[1])
            key = f"max_units_running[{lim}]"
            self.counts[key] = max(self.counts[key], running)
            if running > cap:
                bad.append(f"{lim}: {running} units running, limit {cap}")
            if unslotted:
                bad.append(
                    f"{lim}: {unslotted} running job(s) do not hold their cost in units of "
                    "their lease"
                )
        # Every unit held, wherever it lives and whoever holds it, within its limit (the
        # unique slot numbers 1..concurrency: never more, even for a job claimed in a gap).
        held = sql.SQL(
            "SELECT h.name, count(*) FROM (SELECT s.limit_name AS name FROM {s} AS s"
            " UNION ALL SELECT 'queue:' || j.queue_name FROM {j} AS j"
            " WHERE j.queue_slot IS NOT NULL) AS h GROUP BY 1"
        ).format(s=s, j=j)
        for name, n in conn.execute(held):
            cap = caps.get(name, KEY_FAMILY[1] if name.startswith("key:chaos-tenant:") else None)
            self.counts[f"max_units_held[{name}]"] = max(self.counts[f"max_units_held[{name}]"], n)
            if cap is not None and n > cap:
                bad.append(f"{name}: {n} units held, limit {cap}")
        orphans = sql.SQL(
            "SELECT s.limit_name, s.slot, s.job_id, s.lease_token, j.status::text, j.lease_token"
            " FROM {s} AS s LEFT JOIN {j} AS j ON j.id = s.job_id"
            " WHERE j.id IS NULL OR j.status <> 'running' OR j.lease_token <> s.lease_token"
        ).format(s=s, j=j)
        for name, slot, job, token, status, now_token in conn.execute(orphans):
            bad.append(
                f"slot {slot} of {name} held by job {job} token {token}, which is {status} "
                f"under token {now_token}"
            )
        return bad

    def final(self, ctx: CapContext, conn: psycopg.Connection[Any]) -> list[str]:
        bad = self.sample(ctx, conn)
        j = ctx.table("jobs")
        ((slots,),) = conn.execute(
            sql.SQL("SELECT count(*) FROM {}").format(ctx.table("limit_slots"))
        )
        ((queue_slots,),) = conn.execute(
            sql.SQL("SELECT count(*) FROM {} WHERE queue_slot IS NOT NULL").format(j)
        )
        if slots:
            bad.append(f"{slots} slot row(s) left after the run")
        if queue_slots:
            bad.append(f"{queue_slots} queue slot(s) left held after the run")
        rows = conn.execute(
            sql.SQL(
                "SELECT task, status::text, count(*) FROM {} WHERE payload->>'cap' = 'limits'"
                " GROUP BY 1, 2"
            ).format(j)
        ).fetchall()
        total = 0
        for task, status, n in rows:
            total += n
            if status != "succeeded":
                bad.append(f"{n} {task} job(s) ended {status}")
        if total != self.counts["jobs"]:
            bad.append(f"{self.counts['jobs']} limited jobs enqueued, {total} found")
        return bad
