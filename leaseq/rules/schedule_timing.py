"""Schedule arithmetic, pure (no I/O): when a schedule ticks, and which ticks are due.

A schedule's timing is a cron expression (5 fields, or 6 with a leading seconds field),
read in an IANA time zone, or a fixed interval ``every`` (seconds, at least 1), aligned to
the Unix epoch so every ticker computes the same instants. A tick's identity is its UTC
instant. The cron library (cronsim) only ever sees naive local wall-clock times; the time
zone rules are applied here, explicitly:

- a local time that does not exist (spring forward) ticks once, at the first instant after
  the gap (several such times collapse into that one instant);
- an ambiguous local time (fall back) ticks once, at its first occurrence: the second pass
  through the repeated hour has no ticks of its own.

``due`` applies a catch-up policy to the ticks between the stored ``next_tick`` and the
database's ``now``: ``none`` (only a tick that is on time), ``latest`` (the most recent
tick, if within ``grace`` seconds), ``all`` (every missed tick, at most ``catch_up_max``,
the most recent ones).
"""

from __future__ import annotations

import collections
import functools
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from leaseq.errors import ConfigError

CATCH_UP_POLICIES = ("none", "latest", "all")
OVERLAP_POLICIES = ("allow", "skip", "queue")
#: ``latest`` runs the most recent missed tick only if it is at most this old (seconds).
DEFAULT_GRACE = 600.0
DEFAULT_CATCH_UP_MAX = 100
CATCH_UP_MAX_LIMIT = 10_000
#: A tick run at most this long after its instant is on time, not a catch-up run.
ON_TIME = 60.0
#: Longest interval ``every`` accepts (a year); longer periods are cron expressions.
EVERY_MAX = 366 * 86400.0
#: Ticks enumerated one by one at most (the computation runs on the worker's event loop):
#: a longer outage's skipped count is then a lower bound.
_COUNT_LIMIT = 20_000
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_US = timedelta(microseconds=1)


@functools.lru_cache(maxsize=256)
def zone(name: str) -> ZoneInfo:
    """The IANA zone ``name``; a one-line ConfigError when unknown."""
    if not isinstance(name, str) or not name or len(name) > 64:
        raise ConfigError(f"unknown time zone {name!r}")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise ConfigError(f"unknown time zone {name!r} (use an IANA name such as UTC)") from None


def check_cron(expr: object) -> str:
    """A 5-field cron expression, or 6 fields with a leading seconds field."""
    if not isinstance(expr, str) or not expr.strip() or len(expr) > 200:
        raise ConfigError(f"bad cron expression {expr!r}")
    fields = expr.split()
    if len(fields) not in (5, 6):
        raise ConfigError(
            f"bad cron expression {expr!r}: use 5 fields (minute hour day month weekday), "
            "or 6 with a leading seconds field"
        )
    try:
        CronSim(expr, datetime(2000, 1, 1))
    except (CronSimError, ValueError, KeyError, IndexError) as exc:
        raise ConfigError(f"bad cron expression {expr!r}: {exc}") from None
    return " ".join(fields)


def check_every(every: object) -> float:
    """An interval in seconds (a number or a timedelta), at least 1 s."""
    if isinstance(every, timedelta):
        every = every.total_seconds()
    if isinstance(every, bool) or not isinstance(every, int | float) or every != every:
        raise ConfigError(f"every must be a number of seconds or a timedelta, got {every!r}")
    if not 1 <= every <= EVERY_MAX:
        raise ConfigError(f"every must be between 1 second and a year, got {every!r}")
    return float(every)


def check_policies(catch_up: object, catch_up_max: object, grace: object, overlap: object) -> None:
    if catch_up not in CATCH_UP_POLICIES:
        raise ConfigError(f"catch_up must be one of {', '.join(CATCH_UP_POLICIES)}: {catch_up!r}")
    if overlap not in OVERLAP_POLICIES:
        raise ConfigError(f"overlap must be one of {', '.join(OVERLAP_POLICIES)}: {overlap!r}")
    if (
        isinstance(catch_up_max, bool)
        or not isinstance(catch_up_max, int)
        or not 1 <= catch_up_max <= CATCH_UP_MAX_LIMIT
    ):
        raise ConfigError(f"catch_up_max must be an integer in 1..{CATCH_UP_MAX_LIMIT}")
    if isinstance(grace, bool) or not isinstance(grace, int | float) or not 1 <= grace <= 86400:
        raise ConfigError(f"grace must be between 1 second and a day, got {grace!r}")


@dataclass(frozen=True)
class Timing:
    """When a schedule ticks: ``cron`` in ``tz``, or ``every`` seconds (exactly one)."""

    cron: str | None = None
    every: float | None = None
    tz: str = "UTC"

    def __post_init__(self) -> None:
        if (self.cron is None) == (self.every is None):
            raise ConfigError("a schedule needs exactly one of cron= and every=")
        if self.cron is not None:
            object.__setattr__(self, "cron", check_cron(self.cron))
        else:
            object.__setattr__(self, "every", check_every(self.every))
        zone(self.tz)

    def describe(self) -> str:
        if self.cron is not None:
            return f"cron {self.cron!r}" + ("" if self.tz == "UTC" else f" {self.tz}")
        return f"every {self.every:g}s"

    def next_after(self, instant: datetime) -> datetime:
        """The first tick strictly after ``instant`` (aware), in UTC."""
        instant = instant.astimezone(UTC)
        if self.every is not None:
            step = round(self.every * 1_000_000)
            elapsed = (instant - _EPOCH) // _US
            return _EPOCH + _US * ((elapsed // step + 1) * step)
        assert self.cron is not None
        tz = zone(self.tz)
        start = instant.astimezone(tz).replace(tzinfo=None)
        # Naive local candidates in order; their instants are non-decreasing except inside a
        # repeated hour, so candidates at or before ``instant`` are passed over (at most a
        # repeated hour's worth when ``instant`` lies in its second pass).
        for candidate in CronSim(self.cron, start):
            found = local_instant(candidate, tz)
            if found > instant:
                return found
        raise ConfigError(f"cron expression {self.cron!r} never ticks again")  # pragma: no cover


def local_instant(naive: datetime, tz: ZoneInfo) -> datetime:
    """The UTC instant of a naive local time: the first occurrence of an ambiguous one, the
    first instant after the gap for one that does not exist."""
    first = naive.replace(tzinfo=tz, fold=0)
    as_utc = first.astimezone(UTC)
    if as_utc.astimezone(tz).replace(tzinfo=None) == naive:
        return as_utc
    # In a gap: fold=0 reads it with the offset before the change (an instant after the
    # change), fold=1 with the offset after it (an instant before). The change lies between.
    lo = naive.replace(tzinfo=tz, fold=1).astimezone(UTC)
    hi = as_utc
    lo, hi = min(lo, hi), max(lo, hi)
    before = lo.astimezone(tz).utcoffset()
    while hi - lo > _US:
        mid = lo + (hi - lo) / 2
        if mid.astimezone(tz).utcoffset() == before:
            lo = mid
        else:
            hi = mid
    return hi


@dataclass(frozen=True)
class Due:
    """What a ticker does now: ``ticks`` to enqueue as ``(instant, catch_up)``, oldest
    first; ``skipped`` missed ticks the catch-up policy leaves out; the ``next_tick`` to
    store."""

    ticks: tuple[tuple[datetime, bool], ...]
    skipped: int
    next_tick: datetime


def due(
    timing: Timing,
    *,
    next_tick: datetime,
    now: datetime,
    catch_up: str = "latest",
    catch_up_max: int = DEFAULT_CATCH_UP_MAX,
    grace: float = DEFAULT_GRACE,
) -> Due:
    """The ticks in ``[next_tick, now]`` that the catch-up policy runs.

    A tick is on time (``catch_up`` False) when it is the most recent one and at most
    ``ON_TIME`` seconds old; every other tick run is a catch-up run.
    """
    if next_tick > now:
        return Due((), 0, next_tick)
    if catch_up == "none":
        horizon: float | None = ON_TIME
    elif catch_up == "latest":
        horizon = grace
    else:
        horizon = None
    keep = catch_up_max if catch_up == "all" else 1
    start = next_tick
    skipped = 0
    if horizon is not None and now - timedelta(seconds=horizon) > next_tick:
        start = timing.next_after(now - timedelta(seconds=horizon) - _US)
        skipped = count_ticks(timing, next_tick, min(start, now + _US))
    recent: collections.deque[datetime] = collections.deque(maxlen=keep)
    seen = 0
    tick = start
    while tick <= now:
        recent.append(tick)
        seen += 1
        if seen >= _COUNT_LIMIT:
            # A very long outage of a fast schedule: jump to the last ``keep`` ticks.
            skipped += seen - len(recent)
            seen = len(recent)
            tick = timing.next_after(now - (now - tick) / 2)  # pragma: no cover
            continue
        tick = timing.next_after(tick)
    runs = list(recent)
    if catch_up == "none":
        runs = [t for t in runs if now - t <= timedelta(seconds=ON_TIME)]
    skipped += seen - len(runs)
    latest = runs[-1] if runs else None
    ticks = tuple((t, not (t == latest and now - t <= timedelta(seconds=ON_TIME))) for t in runs)
    return Due(ticks, skipped, timing.next_after(now))


def count_ticks(timing: Timing, start: datetime, end: datetime) -> int:
    """How many ticks lie in ``[start, end)`` (at most ``_COUNT_LIMIT``)."""
    if timing.every is not None:
        step = round(timing.every * 1_000_000)
        first = (start - _EPOCH) // _US
        last = (end - _EPOCH) // _US
        # ticks are the multiples of step; start is assumed to be one or before one
        return max(0, (last - 1) // step - (first - 1) // step)
    count = 0
    tick = start
    while tick < end and count < _COUNT_LIMIT:
        count += 1
        tick = timing.next_after(tick)
    return count
