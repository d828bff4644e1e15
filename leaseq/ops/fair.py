# Generated from leaseq/ops/fair_async.py by tools/gen_sync.py. Do not edit by hand:
# change the async source and run `python tools/gen_sync.py`.
"""Fair dispatch inside a queue (docs/fairness.md): per-key weights (audited in
``admin_events``) and the per-key view of a fair queue. The fair claim itself is
``claim_fair_jobs`` (leaseq.ops.lease chooses it), the enqueue's touch of the keys is
in leaseq.ops.enqueue; the rules are ``leaseq.rules.fairness``.

The synchronous twin of ``leaseq/ops/fair_async.py``; see that file for the logic.
"""

from __future__ import annotations

from typing import Any

from psycopg import Connection

from leaseq import validate
from leaseq.ops.base import ClientBase
from leaseq.rules.fairness import TOP_KEYS, FairKey, check_weight, fair_keys_from_rows
from leaseq.rules.pauses import check_actor, check_reason


class FairOps(ClientBase):
    def set_fair_weight(
        self,
        queue: str,
        key: str,
        weight: float,
        *,
        actor: str | None = None,
        reason: str | None = None,
    ) -> None:
        """Give ``key`` of the fair queue ``queue`` the weight ``weight`` (default 1): while
        several keys have claimable work, each gets claims in proportion to its weight. The
        key ``""`` is the queue's jobs without a key. Audited (``admin_events``)."""
        params = {
            "queue": validate.check_name("queue", queue),
            "key": key if key == "" else validate.check_fairness_key(key),
            "weight": check_weight(weight),
            "actor": check_actor(actor),
            "reason": check_reason("weight", reason, required=False),
        }
        self._rows("set_fair_weight", params)

    def fair_keys(self, queue: str, *, limit: int = TOP_KEYS) -> list[FairKey]:
        """The keys of a fair queue, the largest backlogs first (at most ``limit``); empty
        for a queue that is not fair."""
        params = {
            "queue": validate.check_name("queue", queue),
            "limit": validate.check_int("limit", limit, 1, 10_000),
        }
        return fair_keys_from_rows(self._rows("fair_keys", params))

    def prune_fair_keys(self, *, older_than: float, batch_size: int = 1000) -> int:
        """Delete fair queues' keys idle for ``older_than`` seconds with no live job left
        (at most ``batch_size``); never a queue's key ``""`` or a weighted key. A key that
        gets a job again is created again, at the queue's current virtual time."""
        params = {
            "older_than": validate.check_positive_seconds("older_than", older_than, 1e10),
            "limit": validate.check_int("batch_size", batch_size, 1, 100_000),
        }
        return len(self._rows("prune_fair_keys", params))

    def vacuum_fair_keys(
        self, *, min_dead: int = 1000, connection: Connection[Any] | None = None
    ) -> bool:
        """Vacuum ``fair_keys`` if the statistics count at least ``min_dead`` dead row versions
        in it (each claim of a fair queue leaves one per key it takes from, and every claim
        steps over their old pass entries until a vacuum removes them); True if the vacuum
        was asked for. It never waits for another vacuum of the table (it skips it instead).
        ``connection``: an autocommit connection of your own (a vacuum cannot run inside a
        transaction); default, a pooled one. A role that does not own the table gets the
        server's warning and nothing is vacuumed (autovacuum still is)."""
        floor = validate.check_int("min_dead", min_dead, 0, 2**62)
        ((dead,),) = self._rows("fair_keys_dead", None, connection)
        if dead < max(floor, 1):
            return False
        self._rows("vacuum_fair_keys", None, connection)
        return True
