"""Schedules under chaos: two interval schedules ticked by every worker's ticker (each
ticker may be killed, stopped or cut off in the middle of a tick), with ``catch_up='all'``
so no tick may go missing, one with ``overlap='allow'`` and one with ``overlap='skip'``.

Sampled: the ``skip`` schedule never has two live jobs. End (the schedules are disabled
when the window ends): each schedule's ticks are contiguous (one every interval, none
missing, none doubled: the primary key), each tick names exactly one job and each of the
schedule's jobs is named by exactly one tick, every tick job succeeded."""

from __future__ import annotations

import datetime as dt
import itertools
from collections import Counter
from typing import Any

import psycopg
from psycopg import sql

from tests.chaos.caps.base import Capability, CapContext

TASK = "chaos.cap"
SCHEDULES = {"chaos-every": (1, "allow"), "chaos-skip": (2, "skip")}


class Schedules(Capability):
    name = "schedules"

    def setup(self, ctx: CapContext) -> None:
        rng = ctx.rng(self.name)
        client = ctx.client()
        try:
            for name, (every, overlap) in SCHEDULES.items():
                work = (0.05, 0.3) if overlap == "allow" else (1.0, 3.0)
                client.schedule_add(
                    name,
                    task=TASK,
                    every=every,
                    payload=ctx.payload(rng, work=work, long_share=0.0, cap="schedule", sched=name),
                    catch_up="all",
                    overlap=overlap,
                    max_attempts=25,
                    actor="chaos",
                )
        finally:
            client.close()

    def window_over(self, ctx: CapContext) -> None:
        client = ctx.client()
        try:
            for name in SCHEDULES:
                client.schedule_disable(name, actor="chaos", reason="the window ended")
        finally:
            client.close()

    def sample(self, ctx: CapContext, conn: psycopg.Connection[Any]) -> list[str]:
        ((live,),) = conn.execute(
            sql.SQL(
                "SELECT count(*) FROM {} WHERE payload->>'sched' = 'chaos-skip'"
                " AND status IN ('pending', 'running')"
            ).format(ctx.table("jobs"))
        )
        self.counts["max_live_skip"] = max(self.counts["max_live_skip"], live)
        return [f"schedule chaos-skip (overlap skip) has {live} live jobs"] if live > 1 else []

    def final(self, ctx: CapContext, conn: psycopg.Connection[Any]) -> list[str]:
        bad: list[str] = []
        for name, (every, _) in SCHEDULES.items():
            ticks = conn.execute(
                sql.SQL(
                    "SELECT tick_at, job_id, skipped FROM {} WHERE schedule_name = %s ORDER BY 1"
                ).format(ctx.table("schedule_ticks")),
                (name,),
            ).fetchall()
            jobs = dict(
                conn.execute(
                    sql.SQL("SELECT id, status::text FROM {} WHERE payload->>'sched' = %s").format(
                        ctx.table("jobs")
                    ),
                    (name,),
                ).fetchall()
            )
            ((skipped_uncounted,),) = conn.execute(
                sql.SQL("SELECT skipped_ticks FROM {} WHERE name = %s").format(
                    ctx.table("schedules")
                ),
                (name,),
            )
            self.counts[f"ticks[{name}]"] = len(ticks)
            self.counts[f"skipped[{name}]"] = sum(1 for t in ticks if t[2])
            if len(ticks) < 0.5 * ctx.seconds / every:
                bad.append(f"{name}: only {len(ticks)} ticks in a {ctx.seconds:g}s window")
            # skipped_ticks counts the overlap skips (each also a row) and the catch-up skips.
            missed = skipped_uncounted - self.counts[f"skipped[{name}]"]
            if missed:
                bad.append(f"{name}: {missed} ticks missed (catch_up all)")
            step = dt.timedelta(seconds=every)
            for (a, *_), (b, *_) in itertools.pairwise(ticks):
                if b - a != step:
                    bad.append(
                        f"{name}: ticks {a:%H:%M:%S.%f} and {b:%H:%M:%S.%f} are {b - a} apart"
                    )
            named = Counter(t[1] for t in ticks if t[1] is not None)
            bad += [f"{name}: job {j} named by {n} ticks" for j, n in named.items() if n > 1]
            bad += [f"{name}: tick job {j} does not exist" for j in named if j not in jobs]
            bad += [f"{name}: job {j} was enqueued by no tick" for j in jobs if j not in named]
            bad += [f"{name}: tick job {j} ended {s}" for j, s in jobs.items() if s != "succeeded"]
            if any(t[2] and t[2] != "overlap" for t in ticks):
                bad.append(f"{name}: ticks skipped for {sorted({t[2] for t in ticks if t[2]})}")
        return bad
