"""Unique jobs and debounce as pure rules: the checked options of a keyed enqueue, what an
enqueue returns (:class:`EnqueueResult`), and how a conflict is resolved. No I/O here: the
enqueue operations (``leaseq.ops.enqueue_async``) apply these decisions with SQL, where the
``unique_keys`` table's primary key is the one thing that decides who holds a key.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from leaseq.errors import ConfigError

#: What an enqueue does when its key is held: return the holder (skip), update a pending
#: holder or queue a follow-up behind a running one (replace), or raise UniqueConflict.
ON_CONFLICT = ("skip", "replace", "raise")

#: States that always hold a key: a key is unique among live jobs at least.
LIVE_STATES = ("pending", "running")
#: Final states that may hold a key for ``unique_for`` after the job finished in them.
FINAL_STATES = ("succeeded", "dead", "cancelled")
#: The states when only ``unique_for`` is given.
DEFAULT_WINDOW_STATES = ("pending", "running", "succeeded")

#: The longest window or debounce accepted (ten years), so database arithmetic never overflows.
MAX_SECONDS = 10 * 365 * 86400.0

#: Conflict outcomes, as counted by ``leaseq_unique_conflicts_total{outcome}``.
OUTCOMES = ("skip", "replace", "follow_up", "raise")


def _seconds(kind: str, value: object) -> float | None:
    if value is None:
        return None
    if isinstance(value, dt.timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{kind} must be seconds or a timedelta, got {value!r:.60}")
    seconds = float(value)
    if not math.isfinite(seconds) or seconds <= 0 or seconds > MAX_SECONDS:
        raise ConfigError(
            f"{kind} must be more than 0 and at most {MAX_SECONDS:g} seconds, got {value!r:.60}"
        )
    return seconds


def _key(value: object) -> str:
    if (
        not isinstance(value, str)
        or not value
        or len(value) > 200
        or "\x00" in value
        or not _utf8(value)
    ):
        raise ConfigError(
            f"unique_key must be a non-empty string of at most 200 characters "
            f"(no NUL, valid Unicode), got {value!r:.60}"
        )
    return value


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _states(value: object, window: float | None) -> tuple[str, ...]:
    if value is None:
        return DEFAULT_WINDOW_STATES if window is not None else LIVE_STATES
    if isinstance(value, str) or not isinstance(value, Iterable):
        raise ConfigError(f"unique_states must be a list of states, got {value!r:.60}")
    states = tuple(dict.fromkeys(str(s) for s in value))
    unknown = [s for s in states if s not in LIVE_STATES + FINAL_STATES]
    if unknown:
        raise ConfigError(f"unique_states: unknown state(s) {', '.join(unknown)}")
    if not all(s in states for s in LIVE_STATES):
        raise ConfigError("unique_states must contain pending and running")
    finals = [s for s in states if s in FINAL_STATES]
    if finals and window is None:
        raise ConfigError(f"unique_states lists {', '.join(finals)} but no unique_for is given")
    return tuple(s for s in LIVE_STATES + FINAL_STATES if s in states)


@dataclass(frozen=True)
class UniqueOptions:
    """The checked unique options of one job."""

    key: str
    #: Seconds the key stays held after the job finished in one of ``states``' final states.
    window: float | None
    states: tuple[str, ...]
    on_conflict: str
    debounce: float | None = None
    debounce_max: float | None = None


def unique_options(
    unique_key: object,
    unique_for: object = None,
    unique_states: object = None,
    on_conflict: object = None,
    debounce: object = None,
    debounce_max: object = None,
) -> UniqueOptions | None:
    """The checked options, or None without a key (then no other option may be given)."""
    if unique_key is None:
        given = [
            name
            for name, value in (
                ("unique_for", unique_for),
                ("unique_states", unique_states),
                ("on_conflict", on_conflict),
                ("debounce", debounce),
                ("debounce_max", debounce_max),
            )
            if value is not None
        ]
        if given:
            raise ConfigError(f"{', '.join(given)} needs a unique_key")
        return None
    key = _key(unique_key)
    window = _seconds("unique_for", unique_for)
    states = _states(unique_states, window)
    wait = _seconds("debounce", debounce)
    cap = _seconds("debounce_max", debounce_max)
    if cap is not None and wait is None:
        raise ConfigError("debounce_max needs debounce")
    if wait is not None and cap is not None and cap < wait:
        raise ConfigError(f"debounce_max ({cap:g}s) must be at least debounce ({wait:g}s)")
    if on_conflict is None:
        mode = "replace" if wait is not None else "skip"
    elif on_conflict not in ON_CONFLICT:
        raise ConfigError(f"on_conflict must be skip, replace or raise, got {on_conflict!r:.60}")
    else:
        mode = str(on_conflict)
    if wait is not None and mode != "replace":
        raise ConfigError(f"debounce replaces the pending job: on_conflict={mode} contradicts it")
    return UniqueOptions(key, window, states, mode, wait, cap)


def check_schedule(options: UniqueOptions | None, run_at: object, delay: object) -> None:
    """A debounce sets the job's start itself: run_at or delay with it is refused."""
    debounced = options is not None and options.debounce is not None
    if debounced and (run_at is not None or delay is not None):
        raise ConfigError("debounce sets when the job runs: give no run_at or delay with it")


class EnqueueResult(int):
    """What an enqueue returns: the job's id (an ``int``, so callers that use the result
    as an id are unchanged), and what happened.

    ``inserted``: a new job was stored (also true of a follow-up queued behind a running
    holder). ``existing``: the id is an existing job that held the key. ``replaced``: that
    pending job's payload/schedule/priority were replaced. ``conflict_state``: the holder's
    state when the key was held (``None`` without a conflict). ``outcome``: skip, replace,
    follow_up, or None without a conflict. It prints as the plain id.
    """

    # Class-level defaults: a plain insert's result is just int.__new__ (see ``new``).
    inserted: bool = True
    existing: bool = False
    replaced: bool = False
    conflict_state: str | None = None
    outcome: str | None = None

    @classmethod
    def new(cls, job_id: int) -> EnqueueResult:
        """A newly inserted job without a conflict, at the cost of an int (bulk enqueues)."""
        return int.__new__(cls, job_id)

    def __new__(
        cls,
        job_id: int,
        *,
        inserted: bool = True,
        replaced: bool = False,
        conflict_state: str | None = None,
        outcome: str | None = None,
    ) -> EnqueueResult:
        result = super().__new__(cls, job_id)
        result.inserted = inserted
        result.existing = not inserted
        result.replaced = replaced
        result.conflict_state = conflict_state
        result.outcome = outcome
        return result

    def __reduce__(self) -> Any:
        return (int, (int(self),))

    def __str__(self) -> str:
        return int.__repr__(self)  # prints as the plain id

    def __repr__(self) -> str:
        if self.outcome is None and self.inserted:
            return f"EnqueueResult({int(self)})"
        return (
            f"EnqueueResult({int(self)}, inserted={self.inserted}, replaced={self.replaced}, "
            f"conflict_state={self.conflict_state!r}, outcome={self.outcome!r})"
        )


class ReplayResult(int):
    """How many jobs a bulk replay brought back (an ``int``), and ``refused``: the
    (job id, holder id or None) of each job left as it was because a live duplicate holds
    its unique key."""

    refused: tuple[tuple[int, int | None], ...]

    def __new__(cls, replayed: int, refused: Iterable[tuple[int, int | None]] = ()) -> ReplayResult:
        result = super().__new__(cls, replayed)
        result.refused = tuple(refused)
        return result


def resolve_conflict(on_conflict: str, state: str, window: bool) -> str:
    """What an enqueue does when the key is held by a job in ``state`` (``window``: only
    a finished job's window holds it): one of :data:`OUTCOMES`. A window is never
    replaced (its job finished); a running job is never modified: it gets a follow-up."""
    if on_conflict == "raise":
        return "raise"
    if on_conflict == "skip" or window:
        return "skip"
    return "replace" if state == "pending" else "follow_up"


def holder_state(status: str | None, held_until: object) -> str:
    """The conflict state reported for a key's holder: the job's status, or ``finished``
    when only its window is left (the job row was pruned or purged)."""
    if status is not None:
        return status
    return "finished" if held_until is not None else "pending"


def unique_params(params: Mapping[str, Any]) -> dict[str, Any]:
    """The parameters of insert_unique_job, unique_replace and insert_follow_up."""
    unique: UniqueOptions = params["unique"]
    out = {k: v for k, v in params.items() if k != "unique"}
    out.update(
        unique_key=unique.key,
        unique_for=unique.window,
        unique_states=list(unique.states),
        debounce=unique.debounce,
        debounce_max=unique.debounce_max,
    )
    return out
