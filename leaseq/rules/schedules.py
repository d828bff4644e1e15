"""Schedules as data, pure (no I/O): the checked declaration (``ScheduleDef``), the stored row
(``Schedule``), one tick as a job sees it (``ScheduleTick``, ``ctx.schedule``), and the
statement parameters and row decoding the schedule operations use.

A tick job's identity travels in its idempotency key,
``leaseq.schedule@<UTC instant>/<kind>/<schedule name>`` (kind ``tick``, ``catch-up`` or
``manual``): stable across the job's attempts, unique per tick, and what ``ctx.schedule``
is read from, so the payload stays exactly the schedule's payload.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from leaseq import validate
from leaseq.errors import ConfigError
from leaseq.rows import json_loads
from leaseq.rules.schedule_timing import (
    DEFAULT_CATCH_UP_MAX,
    DEFAULT_GRACE,
    Due,
    Timing,
    check_policies,
    due,
)

KEY_PREFIX = "leaseq.schedule@"
#: Overlap "queue": tick jobs of a schedule share this ordering key (plus the name).
ORDERING_PREFIX = "leaseq.schedule:"


@dataclass(frozen=True)
class ScheduleDef:
    """A schedule as declared (``app.schedule``) or added (``Client.schedule_add``), checked:
    a bad value raises a one-line ConfigError before anything is stored."""

    name: str
    task: str
    timing: Timing
    payload: Any = None
    queue: str = validate.DEFAULT_QUEUE
    priority: int = validate.DEFAULT_PRIORITY
    max_attempts: int = validate.DEFAULT_MAX_ATTEMPTS
    catch_up: str = "latest"
    catch_up_max: int = DEFAULT_CATCH_UP_MAX
    grace: float = DEFAULT_GRACE
    overlap: str = "allow"
    enabled: bool = True
    #: Its jobs' cost: the units they take of every concurrency limit (docs/limits.md).
    cost: int = 1
    #: The payload as stored (JSON text), filled in by __post_init__.
    payload_text: str = field(default="", compare=False, repr=False)

    def __post_init__(self) -> None:
        validate.check_name("schedule", self.name)
        validate.check_name("task", self.task)
        validate.check_name("queue", self.queue)
        validate.check_priority(self.priority)
        validate.check_max_attempts(self.max_attempts)
        validate.check_cost(self.cost)
        check_policies(self.catch_up, self.catch_up_max, self.grace, self.overlap)
        if not isinstance(self.enabled, bool):
            raise ConfigError(f"enabled must be True or False, got {self.enabled!r}")
        object.__setattr__(self, "payload_text", validate.encode_payload(self.payload))

    def params(self, next_tick: dt.datetime, actor: str | None) -> dict[str, Any]:
        """Parameters of insert_schedule / upsert_code_schedule / update_schedule."""
        return {
            "name": self.name,
            "task": self.task,
            "cron": self.timing.cron,
            "every_seconds": self.timing.every,
            "payload": self.payload_text,
            "tz": self.timing.tz,
            "queue": self.queue,
            "priority": self.priority,
            "max_attempts": self.max_attempts,
            "catch_up": self.catch_up,
            "catch_up_max": self.catch_up_max,
            "grace_seconds": float(self.grace),
            "overlap": self.overlap,
            "enabled": self.enabled,
            "cost": self.cost,
            "next_tick": next_tick,
            "actor": actor,
        }


def schedule_def(name: str, task: str, **options: Any) -> ScheduleDef:
    """A ScheduleDef from keyword options (``cron``, ``every``, ``tz`` make the timing)."""
    timing = Timing(
        cron=options.pop("cron", None),
        every=options.pop("every", None),
        tz=options.pop("tz", "UTC") or "UTC",
    )
    unknown = set(options) - set(ScheduleDef.__dataclass_fields__) - {"timing"}
    if unknown:
        raise ConfigError(f"unknown schedule option(s): {', '.join(sorted(unknown))}")
    return ScheduleDef(name, task, timing, **options)


@dataclass(frozen=True)
class Schedule:
    """A stored schedule, as ``Client.schedules()`` and ``leaseq schedules list`` show it."""

    definition: ScheduleDef
    source: str
    last_tick: dt.datetime | None
    next_tick: dt.datetime
    last_job_id: int | None
    last_job_status: str | None
    skipped_ticks: int
    updated_by: str | None
    updated_at: dt.datetime
    created_at: dt.datetime
    #: The database's clock when the row was read.
    read_at: dt.datetime

    @property
    def name(self) -> str:
        return self.definition.name

    @property
    def enabled(self) -> bool:
        return self.definition.enabled

    @property
    def overdue(self) -> float:
        """Seconds past its next tick (0 when not due yet or disabled)."""
        if not self.enabled:
            return 0.0
        return max(0.0, (self.read_at - self.next_tick).total_seconds())

    def due(self) -> Due:
        d = self.definition
        return due(
            d.timing,
            next_tick=self.next_tick,
            now=self.read_at,
            catch_up=d.catch_up,
            catch_up_max=d.catch_up_max,
            grace=d.grace,
        )

    def as_dict(self) -> dict[str, Any]:
        d = self.definition
        return {
            "name": d.name,
            "task": d.task,
            "cron": d.timing.cron,
            "every": d.timing.every,
            "tz": d.timing.tz,
            "payload": d.payload,
            "queue": d.queue,
            "priority": d.priority,
            "catch_up": d.catch_up,
            "catch_up_max": d.catch_up_max,
            "grace": d.grace,
            "overlap": d.overlap,
            "enabled": d.enabled,
            "source": self.source,
            "last_tick": _iso(self.last_tick),
            "next_tick": _iso(self.next_tick),
            "last_job_id": self.last_job_id,
            "last_job_status": self.last_job_status,
            "skipped_ticks": self.skipped_ticks,
            "updated_by": self.updated_by,
            "updated_at": _iso(self.updated_at),
        }


def _iso(value: dt.datetime | None) -> str | None:
    return None if value is None else value.astimezone(dt.UTC).isoformat()


def schedule_from_row(row: Sequence[Any]) -> Schedule:
    """A row of ``{_schedule_columns}, now()``. Stored rows passed the CHECKs, so they decode;
    the timing is not re-validated against this cronsim (it was checked when stored)."""
    (name, task, cron, every, payload, tz, queue, priority, max_attempts, catch_up,
     catch_up_max, grace, overlap, enabled, source, last_tick, next_tick, last_job_id,
     last_job_status, skipped, updated_by, updated_at, created_at, cost, read_at) = row  # fmt: skip
    timing = Timing.__new__(Timing)
    object.__setattr__(timing, "cron", cron)
    object.__setattr__(timing, "every", every)
    object.__setattr__(timing, "tz", tz)
    definition = ScheduleDef.__new__(ScheduleDef)
    values = {
        "name": name,
        "task": task,
        "timing": timing,
        "payload": json_loads(payload),
        "queue": queue,
        "priority": priority,
        "max_attempts": max_attempts,
        "catch_up": catch_up,
        "catch_up_max": catch_up_max,
        "grace": grace,
        "overlap": overlap,
        "enabled": enabled,
        "cost": cost,
        "payload_text": payload,
    }
    for key, value in values.items():
        object.__setattr__(definition, key, value)
    return Schedule(
        definition,
        source,
        last_tick,
        next_tick,
        last_job_id,
        last_job_status,
        int(skipped),
        updated_by,
        updated_at,
        created_at,
        read_at,
    )


def changed(current: ScheduleDef, changes: dict[str, Any]) -> ScheduleDef:
    """``current`` with ``changes`` applied (None values are left out), checked again.
    Giving ``cron`` drops ``every`` and the other way round."""
    changes = {k: v for k, v in changes.items() if v is not None}
    timing = current.timing
    if "cron" in changes or "every" in changes or "tz" in changes:
        cron = changes.pop("cron", None)
        every = changes.pop("every", None)
        if cron is None and every is None:
            cron, every = timing.cron, timing.every
        timing = Timing(cron=cron, every=every, tz=changes.pop("tz", timing.tz))
    return replace(current, timing=timing, **changes)


@dataclass(frozen=True)
class ScheduleTick:
    """The tick a job was enqueued for (``ctx.schedule``): the schedule's name, the tick's
    UTC instant, whether it runs late as a catch-up, and whether an operator asked for it
    (``schedules run``)."""

    name: str
    scheduled_for: dt.datetime
    catch_up: bool
    manual: bool = False


def tick_key(name: str, tick_at: dt.datetime, *, catch_up: bool, manual: bool = False) -> str:
    kind = "manual" if manual else "catch-up" if catch_up else "tick"
    instant = tick_at.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return f"{KEY_PREFIX}{instant}/{kind}/{name}"


def parse_tick_key(key: str | None) -> ScheduleTick | None:
    """The tick behind a schedule job's idempotency key; None for any other key."""
    if not key or not key.startswith(KEY_PREFIX):
        return None
    instant, _, rest = key[len(KEY_PREFIX) :].partition("/")
    kind, _, name = rest.partition("/")
    try:
        when = dt.datetime.strptime(instant, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=dt.UTC)
    except ValueError:
        return None
    if kind not in ("tick", "catch-up", "manual") or not name:
        return None
    return ScheduleTick(name, when, catch_up=kind == "catch-up", manual=kind == "manual")


@dataclass(frozen=True)
class TickRecord:
    """One row of a schedule's tick history."""

    tick_at: dt.datetime
    job_id: int | None
    catch_up: bool
    manual: bool
    skipped: str | None
    created_at: dt.datetime


@dataclass
class TickRound:
    """What one ticker round did: jobs enqueued, ticks skipped (by catch-up or overlap
    policy), schedules handled, and seconds until the earliest next tick (None: none)."""

    enqueued: int = 0
    skipped_catch_up: int = 0
    skipped_overlap: int = 0
    schedules: int = 0
    #: Schedules disabled because their ticks could not be computed (audited).
    parked: int = 0
    next_in: float | None = None
