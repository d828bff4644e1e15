"""Fair dispatch's pure rules: checking a key's weight and turning rows of ``fair_keys``
into :class:`FairKey` (the claim's own rules are SQL, ``claim_fair_jobs``)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from leaseq.errors import ConfigError
from leaseq.models import Printable

#: The largest weight a key may have (the fair_keys CHECK says the same).
WEIGHT_MAX = 1_000_000.0
#: How many keys the CLI, dashboard and metrics show per fair queue (largest backlog first):
#: a bound on the metrics' label sets, whatever the number of keys.
TOP_KEYS = 20


@dataclass(frozen=True)
class FairKey(Printable):
    """A key of a fair queue: its weight, its backlog (claimable or waiting for its turn)
    and running jobs, and whether it is parked (found with nothing claimable a moment ago).
    The key ``""`` stands for the queue's jobs without a key."""

    key: str
    weight: float
    backlog: int
    running: int
    parked: bool

    def share(self, keys: Sequence[FairKey]) -> float:
        """This key's expected share of the claims while every key in ``keys`` with a
        backlog has one: its weight over theirs (0 without a backlog)."""
        if self.backlog == 0:
            return 0.0
        total = sum(k.weight for k in keys if k.backlog > 0)
        return self.weight / total if total else 0.0


def check_weight(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"a fairness weight is a number, got {value!r}")
    weight = float(value)
    if not math.isfinite(weight) or weight <= 0 or weight > WEIGHT_MAX:
        raise ConfigError(
            f"a fairness weight is more than 0 and at most {WEIGHT_MAX:g}, got {value}"
        )
    return weight


def fair_keys_from_rows(rows: Sequence[Sequence[Any]]) -> list[FairKey]:
    return [FairKey(str(r[0]), float(r[1]), int(r[4]), int(r[5]), bool(r[3])) for r in rows]
