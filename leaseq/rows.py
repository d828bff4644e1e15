"""Rows to values: how the client reads what its statements return. Pure code, shared by
the async and sync clients.

A stored row can hold what no leaseq call would write (by hand-written SQL, a bug, an older
version): a payload nested too deeply for Python's JSON decoder, an infinite time, a counter
at its maximum. Reading such a row must not fail the batch it came in: the claim's rows are
decoded one by one and an unreadable one is set aside with its reason (the client ends it
dead), and inspection shows what it can (see ``Job.unreadable``).
"""

from __future__ import annotations

import datetime as dt
import json
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.abc import AdaptContext, Buffer
from psycopg.types.datetime import TimestamptzLoader
from psycopg.types.json import set_json_loads

from leaseq.codes import ErrorCode
from leaseq.models import EffectRecord, Job, JobEvent, Lease, QueueStats
from leaseq.states import JobStatus

#: The largest values of the claim's counters (bigint lease_token, integer attempt_count).
#: The claim saturates at them instead of overflowing (see claim_jobs).
TOKEN_MAX = 2**63 - 1
ATTEMPT_MAX = 2**31 - 1

_JSON_DECODER = json.JSONDecoder()

#: What reading a stored value can raise in Python when the value is out of its range.
_UNREADABLE = (ValueError, OverflowError, RecursionError, TypeError)


def json_loads(data: str | bytes) -> Any:
    # psycopg hands json.loads the bytes, which makes it sniff their encoding first: half
    # the cost of reading a small payload. The server always sends UTF-8.
    return _JSON_DECODER.decode(data.decode() if isinstance(data, bytes) else data)


def configure_json(context: AdaptContext) -> None:
    """How jsonb values are read on a connection (or cursor)."""
    set_json_loads(json_loads, context)


_MIN = dt.datetime.min.replace(tzinfo=dt.UTC)
_MAX = dt.datetime.max.replace(tzinfo=dt.UTC)


class _BoundedTimestamptzLoader(TimestamptzLoader):
    """A timestamptz Python cannot hold (±infinity, or beyond years 1..9999) read as the
    nearest datetime there is, instead of failing the whole result."""

    def load(self, data: Buffer) -> dt.datetime:
        raw = bytes(data)
        if raw == b"infinity":
            return _MAX
        if raw == b"-infinity":
            return _MIN
        try:
            return super().load(data)
        except psycopg.DataError:
            return _MIN if raw.endswith(b" BC") else _MAX


def tolerate_extremes(context: AdaptContext) -> None:
    """Read timestamps out of Python's range on this cursor (inspection statements)."""
    context.adapters.register_loader("timestamptz", _BoundedTimestamptzLoader)


@dataclass(frozen=True)
class Unclaimable:
    """A claimed row that cannot become a Lease, with why: the client ends it dead through
    a fenced write under the lease the claim just took."""

    job_id: int
    token: int
    owner: str
    ordering_key: str | None
    code: ErrorCode
    reason: str


def _row_problem(token: int, attempt: int, created_age: Any, available_age: Any) -> str | None:
    if token >= TOKEN_MAX:
        return f"lease_token reached its maximum ({TOKEN_MAX}): it can no longer fence"
    if attempt >= ATTEMPT_MAX:
        return f"attempt_count reached its maximum ({ATTEMPT_MAX})"
    if created_age is None or available_age is None:
        return "created_at or available_at is not a finite time"
    return None


def leases_from_rows(
    rows: Iterable[Sequence[Any]], lease_seconds: float
) -> tuple[list[Lease], list[Unclaimable]]:
    """Leases from claim_jobs rows, and the rows that cannot be leases.

    The statement sends its database times as float seconds (its clock once, then the
    job's ages), which the times here are rebuilt from: a timestamptz column costs about a
    microsecond to format and parse, and all of one claim's rows share its now(). The Lease
    is built without the dataclass __init__, which sets each of its 19 fields through
    object.__setattr__ (frozen): together these were a fifth of the worker's cost of taking
    a job. The payload comes as JSON text and is decoded here, row by row, so that one
    undecodable payload costs only its own job.
    """
    leases = []
    unclaimable = []
    length = dt.timedelta(seconds=lease_seconds)
    seen_clock: float | None = None
    claimed_at = expires_at = dt.datetime.min
    claimed_monotonic = time.monotonic()
    decode = _JSON_DECODER.decode
    for (
        job_id,
        token,
        owner,
        task,
        queue,
        payload,
        attempt,
        max_attempts,
        priority,
        payload_version,
        unknown_failures,
        idempotency_key,
        ordering_key,
        unique_key,
        limited,
        has_dependents,
        clock,
        created_age,
        available_age,
        slot_rows,
        cost_problem,
    ) in rows:
        if cost_problem is not None:
            unclaimable.append(
                Unclaimable(
                    job_id, token, owner, ordering_key, ErrorCode.COST_OVER_LIMIT, cost_problem
                )
            )
            continue
        try:
            problem = _row_problem(token, attempt, created_age, available_age)
            if problem is not None:
                unclaimable.append(
                    Unclaimable(
                        job_id, token, owner, ordering_key, ErrorCode.ROW_OUT_OF_RANGE, problem
                    )
                )
                continue
            if clock != seen_clock:
                seen_clock = clock
                claimed_at = dt.datetime.fromtimestamp(clock, dt.UTC)
                expires_at = claimed_at + length
            created_at = claimed_at - dt.timedelta(seconds=created_age)
            available_at = claimed_at - dt.timedelta(seconds=available_age)
        except _UNREADABLE as exc:
            unclaimable.append(
                Unclaimable(
                    job_id,
                    token,
                    owner,
                    ordering_key,
                    ErrorCode.ROW_OUT_OF_RANGE,
                    f"its times cannot be read: {exc}",
                )
            )
            continue
        try:
            payload = decode(payload)
        except _UNREADABLE as exc:
            unclaimable.append(
                Unclaimable(
                    job_id,
                    token,
                    owner,
                    ordering_key,
                    ErrorCode.INVALID_PAYLOAD,
                    f"payload cannot be decoded: {type(exc).__name__}: {exc}",
                )
            )
            continue
        lease = object.__new__(Lease)
        object.__setattr__(
            lease,
            "__dict__",
            {
                "job_id": job_id,
                "token": token,
                "owner": owner,
                "task": task,
                "queue": queue,
                "payload": payload,
                "attempt": attempt,
                "max_attempts": max_attempts,
                "expires_at": expires_at,
                "priority": priority,
                "created_at": created_at,
                "lease_seconds": lease_seconds,
                "payload_version": payload_version,
                "unknown_failures": unknown_failures,
                "claimed_at": claimed_at,
                "idempotency_key": idempotency_key,
                "available_at": available_at,
                "ordering_key": ordering_key,
                "unique_key": unique_key,
                "limited": limited,
                "slot_rows": slot_rows,
                "has_dependents": has_dependents,
                "claimed_monotonic": claimed_monotonic,
            },
        )
        leases.append(lease)
    return leases, unclaimable


def job_from_row(row: Sequence[Any]) -> Job:
    """A Job from get_job / list_jobs (payload as JSON text). A payload Python cannot
    decode is shown as None, with the reason in ``unreadable``."""
    values = list(row)
    values[4] = JobStatus(values[4])
    unreadable = None
    try:
        values[3] = None if values[3] is None else _JSON_DECODER.decode(values[3])
    except _UNREADABLE as exc:
        values[3] = None
        unreadable = f"payload cannot be decoded: {type(exc).__name__}: {exc}"
    values.append(unreadable)
    return Job(*values)


def event_from_row(row: Sequence[Any]) -> JobEvent:
    return JobEvent(*row)


def stats_from_row(row: Sequence[Any]) -> QueueStats:
    return QueueStats(*row)


def effect_from_row(row: Sequence[Any]) -> EffectRecord:
    return EffectRecord(*row)
