"""Unique keys under chaos: a producer keeps enqueuing a few keys with ``replace`` (the
holder's payload replaced while pending, a follow-up queued while it runs) and ``skip``,
some jobs longer than a lease, some failing once (a retry racing a follow-up). Now and
then the producer also stands in for a worker that shuts down with a prefetched lease: it
claims a keyed job, enqueues a replacement for its key (a follow-up: the holder is
running), then gives the lease back with ``release``, the statement of a shutdown.

Sampled: at most one live job per key that is not superseded, i.e. at most one *pending*
job per key, every pending keyed job is its key's holder (a superseded job never becomes
pending again: not by a retry, a sweep nor a shutdown's release), and every key row held
by a live job points at a live job of that key. End: no key still held by a live job, no
superseded job ever claimed again, and each key's last accepted version ran to success
(nothing lost)."""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any

import psycopg
from psycopg import sql

from tests.chaos.app import UNIQUE_QUEUE
from tests.chaos.caps.base import Capability, CapContext

KEYS = 12
TASK = "chaos.cap.unique"
RELEASER = "chaos-releaser"


class UniqueKeys(Capability):
    name = "unique"

    def __init__(self) -> None:
        super().__init__()
        #: key -> (last version whose enqueue certainly took effect, versions attempted)
        self.accepted: dict[str, int] = {}
        self.uncertain: dict[str, set[int]] = defaultdict(set)

    def produce(self, ctx: CapContext) -> None:
        rng = ctx.rng(self.name)
        version = 0
        client = None
        while not ctx.stop.is_set():
            key = f"chaos-u{rng.randrange(KEYS)}"
            policy = "replace" if rng.random() < 0.75 else "skip"
            mode = "flaky" if rng.random() < 0.15 else "ok"
            version += 1
            payload = ctx.payload(rng, work=(0.05, 0.8), long_share=0.1, mode=mode, v=version)
            try:
                if client is None:
                    client = ctx.client()
                lease = None
                if rng.random() < 0.15:
                    leases = client.claim(UNIQUE_QUEUE, worker=RELEASER, lease_seconds=30)
                    lease = leases[0] if leases and leases[0].unique_key else None
                    if lease is not None:
                        key, policy = str(lease.unique_key), "replace"
                res = client.enqueue(
                    TASK, payload, unique_key=key, on_conflict=policy, queue=UNIQUE_QUEUE
                )
                if lease is not None:
                    self.counts["released"] += client.release(lease)
            except Exception:
                self.counts["enqueue_errors"] += 1
                self.uncertain[key].add(version)
                if client is not None:
                    client.close()
                client = None
                time.sleep(0.2)
                continue
            self.counts["enqueues"] += 1
            if res.inserted or res.replaced:
                self.accepted[key] = version
                self.counts[res.outcome or "inserted"] += 1
            else:
                self.counts[f"refused_{res.conflict_state}"] += 1
            time.sleep(rng.uniform(0.03, 0.12))
        if client is not None:
            client.close()

    def sample(self, ctx: CapContext, conn: psycopg.Connection[Any]) -> list[str]:
        q = sql.SQL(
            "SELECT j.unique_key, count(*) FILTER (WHERE j.status = 'pending'),"
            " array_agg(j.id) FILTER (WHERE j.status = 'pending' AND"
            "   (k.job_id IS DISTINCT FROM j.id OR k.held_until IS NOT NULL)),"
            " count(*) FILTER (WHERE j.status = 'running')"
            " FROM {} AS j LEFT JOIN {} AS k ON k.unique_key = j.unique_key"
            " WHERE j.unique_key IS NOT NULL AND j.status IN ('pending', 'running')"
            " GROUP BY 1"
        ).format(ctx.table("jobs"), ctx.table("unique_keys"))
        bad = []
        for key, pending, not_holder, running in conn.execute(q):
            self.counts["max_live_per_key"] = max(
                self.counts["max_live_per_key"], pending + running
            )
            if pending > 1:
                bad.append(f"key {key}: {pending} pending jobs at once")
            if not_holder:
                bad.append(f"key {key}: pending job(s) {sorted(not_holder)} do not hold the key")
        lost = sql.SQL(
            "SELECT k.unique_key, k.job_id, j.status::text FROM {} AS k"
            " LEFT JOIN {} AS j ON j.id = k.job_id"
            " WHERE k.held_until IS NULL AND (j.id IS NULL OR j.status NOT IN"
            " ('pending', 'running') OR j.unique_key IS DISTINCT FROM k.unique_key)"
        ).format(ctx.table("unique_keys"), ctx.table("jobs"))
        for key, job, status in conn.execute(lost):
            bad.append(f"key {key} held live by job {job}, which is {status}")
        return bad

    def final(self, ctx: CapContext, conn: psycopg.Connection[Any]) -> list[str]:
        bad = self.sample(ctx, conn)
        held = conn.execute(
            sql.SQL("SELECT unique_key, job_id FROM {} WHERE held_until IS NULL").format(
                ctx.table("unique_keys")
            )
        ).fetchall()
        bad += [f"key {k} still held by job {j} after the run" for k, j in held]
        # A superseded job is never claimed again: a later token means it went back to
        # pending (a release, a retry or a sweep revived it) and ran beside its follow-up.
        revived = conn.execute(
            sql.SQL(
                "SELECT e.job_id, e.unique_key, e.lease_token, j.lease_token,"
                " (SELECT string_agg(x.event, ',' ORDER BY x.id) FROM {e} AS x"
                "  WHERE x.job_id = e.job_id AND x.id > e.id)"
                " FROM (SELECT e.*, j.unique_key FROM {e} AS e JOIN {j} AS j ON j.id = e.job_id"
                "       WHERE e.event = 'superseded') AS e"
                " JOIN {j} AS j ON j.id = e.job_id WHERE j.lease_token > e.lease_token"
            ).format(e=ctx.table("job_events"), j=ctx.table("jobs"))
        ).fetchall()
        self.counts["superseded_claimed_again"] = len(revived)
        bad += [
            f"job {job} (key {key}) superseded under token {then}, claimed again up to token "
            f"{now} (events after: {after})"
            for job, key, then, now, after in revived
        ]
        rows = conn.execute(
            sql.SQL(
                "SELECT unique_key, status::text, (payload->>'v')::int, last_error_code, count(*)"
                " FROM {} WHERE unique_key IS NOT NULL GROUP BY 1, 2, 3, 4"
            ).format(ctx.table("jobs"))
        ).fetchall()
        succeeded: dict[str, set[int]] = defaultdict(set)
        for key, status, version, code, n in rows:
            self.counts[
                f"jobs_{status}" + (f"_{code}" if code and status != "succeeded" else "")
            ] += n
            if status == "succeeded":
                succeeded[key].add(version)
            elif status not in ("cancelled", "dead"):
                bad.append(f"key {key}: job of version {version} ended {status}")
            elif status == "cancelled" and code != "SUPERSEDED":
                bad.append(f"key {key}: version {version} cancelled with {code}")
        self.counts["keys"] = len(self.accepted)
        for key, last in sorted(self.accepted.items()):
            later = {v for v in self.uncertain.get(key, set()) if v > last}
            done = succeeded.get(key, set())
            if last not in done and not (done & later):
                bad.append(
                    f"key {key}: its last accepted version {last} never succeeded "
                    f"(succeeded: {sorted(done)[-3:]})"
                )
        return bad
