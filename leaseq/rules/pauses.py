"""Pure rules of pauses: which scope a call names, the Pause and AdminEvent records, and
their rows. The database side (the claim's check, the barrier) is in
``leaseq/sql/queries/`` (claim.sql, pauses.sql); the client operations are in
``leaseq.ops.pauses_async``.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from leaseq import validate
from leaseq.errors import ConfigError
from leaseq.models import Printable

#: The scopes a pause can name, as stored in pauses.scope.
SCOPES = ("queue", "task", "ordering_key")
ACTOR_MAX = 200


@dataclass(frozen=True)
class Pause(Printable):
    """A pause in force: claims of its scope are not made until it is resumed."""

    scope: str
    value: str
    paused_at: dt.datetime
    paused_by: str | None
    reason: str
    #: Seconds since paused_at, by the database clock.
    paused_for: float


@dataclass(frozen=True)
class AdminEvent(Printable):
    """One operator action that is not about a single job (pause, resume, ...)."""

    id: int
    at: dt.datetime
    actor: str | None
    action: str
    scope: str | None
    value: str | None
    reason: str | None
    detail: str | None


def scope_of(queue: object, task: object, ordering_key: object) -> tuple[str, str]:
    """The (scope, value) named by exactly one of queue, task, ordering_key."""
    given = [
        (scope, value)
        for scope, value in zip(SCOPES, (queue, task, ordering_key), strict=True)
        if value is not None
    ]
    if len(given) != 1:
        raise ConfigError("name exactly one scope: a queue, a task or an ordering key")
    scope, value = given[0]
    if scope == "ordering_key":
        key = validate.check_ordering_key(value)
        assert key is not None
        return scope, key
    return scope, validate.check_name(scope, value)


def check_reason(verb: str, reason: object, *, required: bool) -> str | None:
    if reason is None and not required:
        return None
    if not isinstance(reason, str) or not reason.strip():
        raise ConfigError(f"{verb} needs a reason")
    return validate.bound_detail(reason)


def check_actor(actor: object) -> str | None:
    if actor is None:
        return None
    if not isinstance(actor, str) or len(actor) > ACTOR_MAX:
        raise ConfigError(f"actor must be a string of at most {ACTOR_MAX} characters")
    return validate.bound_detail(actor)


def pauses_from_rows(rows: list[tuple[Any, ...]]) -> list[Pause]:
    return [Pause(*row) for row in rows]


def admin_events_from_rows(rows: list[tuple[Any, ...]]) -> list[AdminEvent]:
    return [AdminEvent(*row) for row in rows]
