"""Pure rules of flow control: limit names, RateLimit, the Limit record and its row, the
checks of ``set_limit`` and of a job's limit key. Enforcement is in the database (the
claim's ``admit()`` and the slot release in the fenced statements, migration 0011); the
client operations are in ``leaseq.ops.limits_async``.

Names: ``queue:NAME`` (every job of the queue), ``task:NAME`` (every job of the task),
``key:KEY`` (jobs enqueued with that ``limit_key``). A name whose last ``:`` part is ``*``
is a family: ``key:customer:*`` gives each key ``customer:X`` its own limit.
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass
from typing import Any

from leaseq import validate
from leaseq.errors import ConfigError
from leaseq.models import Printable

SCOPES = ("queue", "task", "key")
NAME_MAX = 220
KEY_MAX = 200
CONCURRENCY_MAX = 1_000_000
PER_MAX = 31_622_400.0  # a year (366 days)


@dataclass(frozen=True)
class RateLimit:
    """At most ``rate`` claims per ``per`` seconds, of which ``burst`` may come at once.

    Enforced as GCRA: one claim is admitted every ``per / rate`` seconds on average, and up
    to ``burst`` back to back after a quiet spell. In any window of ``per`` seconds at most
    ``rate * per + burst`` claims are admitted.
    """

    rate: float
    per: float = 1.0
    burst: int | None = None

    def __post_init__(self) -> None:
        check_rate(self.rate, self.per, self.burst)

    @property
    def burst_size(self) -> int:
        return 1 if self.burst is None else self.burst


@dataclass(frozen=True)
class Limit(Printable):
    """A limit in force, with what it holds now (``leaseq limits list``)."""

    name: str
    concurrency: int | None
    rate: float | None
    per_seconds: float
    burst: int
    updated_by: str | None
    updated_at: dt.datetime
    #: Slots held now (a family: over its keys that have no limit of their own).
    in_use: int
    #: Pending claimable jobs under this limit (a family: of its keys that have no limit of
    #: their own). Typed optional for readers of older rows; leaseq always fills it.
    waiting: int | None
    #: Seconds until its rate bucket admits one more claim (0: now; None: no rate).
    rate_wait: float | None


def check_limit_key(value: object) -> str | None:
    """A job's ``limit_key`` (stored; the limit's name is ``key:`` + it)."""
    if value is None:
        return None
    if not isinstance(value, str) or not value or len(value) > KEY_MAX or "\x00" in value:
        raise ConfigError(
            f"limit_key must be a non-empty string of at most {KEY_MAX} characters (no NUL), "
            f"got {value!r:.60}"
        )
    return value


def check_limit_name(name: object) -> str:
    """``queue:NAME``, ``task:NAME`` or ``key:KEY`` (a family when its last part is ``*``)."""
    if not isinstance(name, str) or ":" not in name:
        raise ConfigError(f"a limit is named queue:NAME, task:NAME or key:KEY, got {name!r:.60}")
    scope, _, rest = name.partition(":")
    if scope not in SCOPES or not rest or len(name) > NAME_MAX or "\x00" in name:
        raise ConfigError(
            f"a limit is named queue:NAME, task:NAME or key:KEY (at most {NAME_MAX} "
            f"characters), got {name!r:.60}"
        )
    return name


def check_rate(rate: object, per: object, burst: object) -> None:
    if (
        isinstance(rate, bool)
        or not isinstance(rate, int | float)
        or not math.isfinite(rate)
        or rate <= 0
    ):
        raise ConfigError(f"rate must be a positive number, got {rate!r:.40}")
    if (
        isinstance(per, bool)
        or not isinstance(per, int | float)
        or not math.isfinite(per)
        or not 0 < per <= PER_MAX
    ):
        raise ConfigError(f"per must be seconds in (0, {PER_MAX:g}], got {per!r:.40}")
    if burst is not None:
        validate.check_int("burst", burst, 1, CONCURRENCY_MAX)


def limit_params(
    name: object,
    concurrency: object,
    rate: RateLimit | None,
    actor: str | None,
    reason: str | None,
) -> dict[str, Any]:
    """Parameters of set_limit; a limit needs a concurrency, a rate, or both."""
    checked = check_limit_name(name)
    conc = None
    if concurrency is not None:
        conc = validate.check_int("concurrency", concurrency, 1, CONCURRENCY_MAX)
    if conc is None and rate is None:
        raise ConfigError("a limit needs a concurrency, a rate, or both")
    if rate is not None and not isinstance(rate, RateLimit):
        raise ConfigError(f"rate must be a RateLimit, got {type(rate).__name__}")
    return {
        "name": checked,
        "concurrency": conc,
        "rate": None if rate is None else float(rate.rate),
        "per": 1.0 if rate is None else float(rate.per),
        "burst": 1 if rate is None else rate.burst_size,
        "actor": actor,
        "reason": reason,
    }


def task_limit_name(task: str, keyed: bool) -> str:
    """The limit a task's own options declare: the task's (``task:NAME``), or with a
    ``concurrency_key`` the family of its keys (``key:NAME:*``)."""
    return f"key:{task}:*" if keyed else f"task:{task}"


def task_limit_key(task: str, value: object) -> str:
    """The ``limit_key`` of a job of a task with a ``concurrency_key``: ``NAME:VALUE``."""
    if value is None:
        raise ConfigError(f"task {task}: concurrency_key gave no value for this payload")
    key = f"{task}:{value}"
    checked = check_limit_key(key)
    assert checked is not None
    return checked


def limit_from_row(row: Any) -> Limit:
    return Limit(*row)


# Job cost (docs/limits.md, "Job cost"): the arithmetic admit() (migration 0030) does in the
# claim statement, written out once in Python for the tests' models and checks.


def cost_fits(cost: int, concurrency: int) -> bool:
    """Can a job of ``cost`` ever run under a limit of ``concurrency``? One that cannot is
    ended dead at its claim (COST_OVER_LIMIT) rather than left pending for ever."""
    return cost <= concurrency


def admitted_prefix(costs: list[int], free: int) -> int:
    """How many requesters of one limit, in claim order with these ``costs``, a claim
    admits when ``free`` units are free: the longest prefix whose costs add up to at most
    ``free``. A requester that does not fit holds back those behind it (in this claim), so a
    large job is never overtaken by a stream of small ones."""
    used = 0
    for n, cost in enumerate(costs):
        used += cost
        if used > free:
            return n
    return len(costs)
