"""The one declaration of a job's options: for each, its name, default, check, the columns
of ``jobs`` it is stored in, and which enqueue paths carry it.

Everything else is derived from :data:`OPTIONS` or checked against it:

- :class:`EnqueueOptions`, the keyword options of ``enqueue`` (``**options:
  Unpack[EnqueueOptions]``: mypy and editors catch a misspelled option), of
  ``Task.enqueue`` / ``Task.sig``, the routed client and ``perform_job``;
- :class:`JobSpec`, one job of ``enqueue_many``;
- :func:`job_fields` and :func:`job_params` (defaults, the unknown-option check, every
  check), :func:`job_arrays` (the unnested arrays of ``insert_jobs``), :func:`copy_row`
  (one row of ``copy_jobs``), :data:`SIG_OPTIONS` (what a workflow signature may carry),
  :data:`CALLBACK_OPTIONS` (a batch callback), :data:`TICK_OPTIONS` (a schedule's job).

The types of the two classes have to be written out for the type checker; a unit test
(``tests/unit/test_jobspec.py``) holds them, every insert statement's column list and every
Python path to this table, so a new option that misses a place fails there, by name. Adding
one is: a row here, its field in the two classes, its column in a migration and in the
insert statements of the paths it names (CONTRIBUTING.md, "Adding a per-job option").
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any, TypedDict

from leaseq import validate
from leaseq.errors import ConfigError
from leaseq.rules.deps import check_depends_on
from leaseq.rules.limits import check_limit_key
from leaseq.rules.unique import check_schedule, unique_options

#: The paths a job is inserted by (the statement of each is in :data:`INSERT_STATEMENTS`).
#: ``insert``: one job without an ordering key; ``keyed``: one job with one; ``unique``:
#: a job with a unique key (taken in the same statement); ``arrays``: many jobs in one
#: statement; ``copy``: many jobs by COPY (200 and more, no ordering keys); ``sig``: a
#: workflow signature; ``callback``: a batch callback (inserted by the database when the
#: batch fires); ``tick``: a schedule's job (inserted by the ticker).
PATHS = ("insert", "keyed", "unique", "arrays", "copy", "sig", "callback", "tick")

#: Which insert statement each path uses (``sig`` goes through enqueue_many's paths).
INSERT_STATEMENTS: dict[str, tuple[str, ...]] = {
    "insert": ("insert_job",),
    "keyed": ("insert_keyed_job",),
    "unique": ("insert_unique_job", "take_unique_window", "insert_follow_up"),
    "arrays": ("insert_jobs",),
    "copy": ("copy_jobs",),
    "callback": ("fire_batches",),
    "tick": ("tick_job",),
}

#: Columns an insert statement writes that no option names: the id it drew first (COPY,
#: unique keys, ticks and callbacks insert their own), and an ordering key's ``blocked``.
DERIVED_COLUMNS = frozenset({"id", "blocked"})

DEFAULT_QUEUE = validate.DEFAULT_QUEUE
DEFAULT_PRIORITY = validate.DEFAULT_PRIORITY
DEFAULT_MAX_ATTEMPTS = validate.DEFAULT_MAX_ATTEMPTS
DEFAULT_KEY_POLICY = "block"
DEFAULT_ON_DEAD = "cancel"

_EVERY_INSERT = frozenset({"insert", "keyed", "unique", "arrays", "copy"})
_ALL = _EVERY_INSERT | {"sig", "callback", "tick"}


@dataclass(frozen=True)
class Option:
    """One per-job option. ``check`` turns the given value into what is stored (None: the
    option is checked with others, in :func:`job_params`); ``columns``: the ``jobs`` columns
    it is stored in (none: it decides something at enqueue, or lives in another table);
    ``paths``: the enqueue paths that carry it (:data:`PATHS`)."""

    name: str
    default: Any
    check: Callable[[Any], Any] | None
    columns: tuple[str, ...]
    paths: frozenset[str]
    doc: str


def _check_batch_id(value: object) -> int | None:
    return None if value is None else validate.check_int("batch_id", value, 1, 2**63 - 1)


OPTIONS: tuple[Option, ...] = (
    Option(
        "task",
        None,
        lambda v: validate.check_name("task", v),
        ("task",),
        _ALL,
        "the task's name (required)",
    ),
    Option(
        "payload",
        None,
        None,  # encoded in job_params, under the client's payload limit
        ("payload",),
        _ALL,
        "the JSON payload",
    ),
    Option(
        "queue",
        DEFAULT_QUEUE,
        lambda v: validate.check_name("queue", v),
        ("queue_name",),
        _ALL,
        "the queue the job is claimed from",
    ),
    Option(
        "priority",
        DEFAULT_PRIORITY,
        validate.check_priority,
        ("priority", "base_priority"),
        _ALL,
        "higher runs first (aging raises it while the job waits)",
    ),
    Option(
        "run_at",
        None,
        None,  # with delay, in job_params
        ("available_at",),
        _EVERY_INSERT | {"sig"},
        "when the job becomes claimable (an aware datetime)",
    ),
    Option(
        "delay",
        None,
        None,  # with run_at, in job_params
        ("available_at",),
        _EVERY_INSERT | {"sig"},
        "seconds (or a timedelta) from now, on the database clock",
    ),
    Option(
        "max_attempts",
        DEFAULT_MAX_ATTEMPTS,
        validate.check_max_attempts,
        ("max_attempts",),
        _ALL,
        "attempts before the job ends dead",
    ),
    Option(
        "payload_version",
        None,
        validate.check_payload_version,
        ("payload_version",),
        _EVERY_INSERT | {"sig"},
        "the payload's schema version, for tasks that accept only some",
    ),
    Option(
        "idempotency_key",
        None,
        validate.check_idempotency_key,
        ("idempotency_key",),
        _EVERY_INSERT | {"sig", "tick"},
        "ctx.idempotency_key (default: derived from the job id)",
    ),
    Option(
        "ordering_key",
        None,
        validate.check_ordering_key,
        ("ordering_key",),
        frozenset({"keyed", "unique", "arrays", "tick"}),
        "jobs sharing it run one at a time, in enqueue order",
    ),
    Option(
        "key_policy",
        DEFAULT_KEY_POLICY,
        validate.check_key_policy,
        ("key_policy",),
        _EVERY_INSERT | {"tick"},
        "a dead head blocks its ordering key (block) or lets it move on (skip)",
    ),
    Option(
        "unique_key",
        None,
        None,  # the unique options are checked together (leaseq.rules.unique)
        ("unique_key",),
        frozenset({"unique"}),
        "at most one live job holds it",
    ),
    Option(
        "unique_for",
        None,
        None,
        ("unique_for",),
        frozenset({"unique"}),
        "seconds the key stays held after the job finished in one of unique_states",
    ),
    Option(
        "unique_states",
        None,
        None,
        ("unique_states",),
        frozenset({"unique"}),
        "the states that hold the key",
    ),
    Option(
        "on_conflict",
        None,
        None,
        (),
        frozenset({"unique"}),
        "skip, replace or raise when the key is held",
    ),
    Option(
        "debounce",
        None,
        None,
        (),
        frozenset({"unique"}),
        "start that long after the latest enqueue of the key (implies replace)",
    ),
    Option(
        "debounce_max",
        None,
        None,
        ("debounce_until",),
        frozenset({"unique"}),
        "but no later than this after the first",
    ),
    Option(
        "limit_key",
        None,
        check_limit_key,
        ("limit_key",),
        _EVERY_INSERT,
        "the job is also under the limit key:<limit_key>",
    ),
    Option(
        "depends_on",
        None,
        None,  # with on_dead, in job_params; the edges are rows of job_deps
        (),
        _EVERY_INSERT,
        "job ids (or Ref, Dep) this job waits for",
    ),
    Option(
        "on_dead",
        DEFAULT_ON_DEAD,
        None,
        (),
        _EVERY_INSERT | {"sig"},
        "what a dependency ending dead or cancelled does: cancel, run or ignore",
    ),
    Option(
        "expires",
        None,
        None,  # an instant or seconds from now, in job_params (expires, expires_in)
        ("expires_at",),
        _EVERY_INSERT | {"sig"},
        "the start deadline: never started after it (seconds from now or an aware datetime)",
    ),
    Option(
        "fairness_key",
        None,
        validate.check_fairness_key,
        ("fairness_key",),
        _EVERY_INSERT | {"sig"},
        "claimed in turn with the queue's other keys, weighted round robin (docs/fairness.md)",
    ),
    Option(
        "cost",
        1,
        validate.check_cost,
        ("cost",),
        _ALL,
        "the units (slots) it takes of every concurrency limit that applies (docs/limits.md)",
    ),
    Option(
        "batch_id",
        None,
        _check_batch_id,
        (),  # set by join_batch, in the enqueue's transaction
        _EVERY_INSERT,
        "the open batch the job joins",
    ),
)

BY_NAME: dict[str, Option] = {o.name: o for o in OPTIONS}
#: The defaults of every option but ``task`` (which has none).
DEFAULTS: dict[str, Any] = {o.name: o.default for o in OPTIONS if o.name != "task"}
#: The options a workflow signature may carry (depends_on comes from the flow itself).
SIG_OPTIONS = frozenset(o.name for o in OPTIONS if "sig" in o.paths) - {"task", "payload"}
#: The options a batch callback may carry; the database inserts its job.
CALLBACK_OPTIONS = frozenset(o.name for o in OPTIONS if "callback" in o.paths) - {
    "task",
    "payload",
}
#: The options a schedule's tick gives its job.
TICK_OPTIONS = frozenset(o.name for o in OPTIONS if "tick" in o.paths)
#: The unique-job options (all None: no unique key, the plain insert).
UNIQUE_FIELDS = tuple(o.name for o in OPTIONS if o.paths == frozenset({"unique"}))
#: The options insert_jobs takes as arrays, in the order of its unnest().
ARRAY_OPTIONS = tuple(o.name for o in OPTIONS if "arrays" in o.paths and o.columns)
#: Arrays of insert_jobs that no option is named for, after ARRAY_OPTIONS: ``expires``
#: given as seconds (counted from the database clock, as ``delay``).
DERIVED_ARRAYS = ("expires_in",)


def columns_of(path: str) -> frozenset[str]:
    """The ``jobs`` columns the options of ``path`` are stored in."""
    return frozenset(c for o in OPTIONS if path in o.paths for c in o.columns)


class EnqueueOptions(TypedDict, total=False):
    """The keyword options of ``enqueue`` (besides ``connection``); see :data:`OPTIONS`."""

    queue: str
    priority: int
    run_at: dt.datetime | None
    delay: float | dt.timedelta | None
    max_attempts: int
    payload_version: int | None
    idempotency_key: str | None
    ordering_key: str | None
    key_policy: str
    unique_key: str | None
    unique_for: float | dt.timedelta | None
    unique_states: Sequence[str] | None
    on_conflict: str | None
    debounce: float | dt.timedelta | None
    debounce_max: float | dt.timedelta | None
    limit_key: str | None
    #: Job ids, ``leaseq.Ref`` to earlier items of the batch, or ``leaseq.Dep``.
    depends_on: Sequence[Any] | None
    on_dead: str
    expires: float | dt.timedelta | dt.datetime | None
    fairness_key: str | None
    cost: int
    batch_id: int | None


@dataclass(frozen=True)
class JobSpec:
    """One job for :meth:`Client.enqueue_many`; fields mean what ``enqueue``'s arguments do."""

    task: str
    payload: Any = None
    queue: str = DEFAULT_QUEUE
    priority: int = DEFAULT_PRIORITY
    run_at: dt.datetime | None = None
    delay: float | dt.timedelta | None = None
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    payload_version: int | None = None
    idempotency_key: str | None = None
    ordering_key: str | None = None
    key_policy: str = DEFAULT_KEY_POLICY
    unique_key: str | None = None
    unique_for: float | dt.timedelta | None = None
    unique_states: Sequence[str] | None = None
    on_conflict: str | None = None
    debounce: float | dt.timedelta | None = None
    debounce_max: float | dt.timedelta | None = None
    limit_key: str | None = None
    #: Job ids, ``leaseq.Ref`` to earlier items of the batch, or ``leaseq.Dep``.
    depends_on: Sequence[Any] | None = None
    on_dead: str = DEFAULT_ON_DEAD
    expires: float | dt.timedelta | dt.datetime | None = None
    fairness_key: str | None = None
    cost: int = 1
    batch_id: int | None = None


#: From this many jobs on (without ordering keys), enqueue_many uses COPY.
COPY_THRESHOLD = 200

#: The furthest a job may be scheduled, either way: ``delay`` at most this many seconds,
#: ``run_at`` within this of the local clock. Far enough for any real schedule, and
#: bounded so that the database (and the COPY path's datetime arithmetic) never overflows.
SCHEDULE_HORIZON = 100 * 365 * 86400.0

_OPTION_NAMES = frozenset(BY_NAME)
_JOBSPEC_FIELDS = tuple(f.name for f in fields(JobSpec))


def unknown_options(given: Mapping[str, Any]) -> None:
    """Refuse option names no job has, in one line naming them."""
    unknown = given.keys() - _OPTION_NAMES
    if unknown:
        raise ConfigError(f"unknown job option(s): {', '.join(sorted(map(repr, unknown)))}")


def job_fields(job: JobSpec | Mapping[str, Any]) -> dict[str, Any]:
    """Every field of one job: a JobSpec's, or a mapping's over the defaults. A mapping is
    not turned into a JobSpec first: for a bulk enqueue that cost as much as the checks."""
    if isinstance(job, JobSpec):
        return vars(job)
    if not isinstance(job, Mapping):
        raise ConfigError(f"a job is a JobSpec or a mapping, got {type(job).__name__}")
    unknown_options(job)
    if "task" not in job:
        raise ConfigError("a job needs a task")
    return {**DEFAULTS, **job}


def schedule(run_at: object, delay: object) -> tuple[dt.datetime | None, float]:
    """``validate.schedule``, bounded to :data:`SCHEDULE_HORIZON` either way."""
    run_at, seconds = validate.schedule(run_at, delay)
    if seconds > SCHEDULE_HORIZON:
        raise ConfigError(
            f"delay must be at most {SCHEDULE_HORIZON:g} seconds (100 years), got {seconds:g}"
        )
    if run_at is not None:
        offset = (run_at - dt.datetime.now(dt.UTC)).total_seconds()
        if abs(offset) > SCHEDULE_HORIZON:
            raise ConfigError(f"run_at must be within 100 years of now, got {run_at.isoformat()}")
    return run_at, seconds


#: The options checked one by one, with their checks (the others are checked in groups).
_SIMPLE_CHECKS = tuple((o.name, o.check) for o in OPTIONS if o.check is not None)


def job_params(
    job: Mapping[str, Any],
    payload_limit: int,
    seal: Callable[[str, str], str] | None = None,
) -> dict[str, Any]:
    """The checked parameters of one job (every field of :func:`job_fields`) for the
    insert statements: each option under its own name, run_at/delay as one schedule,
    ``unique`` the checked unique options (None without a unique key), ``deps`` the
    checked edges (None without dependencies), ``reschedule`` whether run_at or delay was
    given. ``seal``: (task, payload JSON) -> the text stored (the client's encryption).
    Runs for every job of a bulk enqueue: kept to one pass of plain lookups."""
    unique = None
    given = tuple(job[name] for name in UNIQUE_FIELDS)
    if any(v is not None for v in given):
        unique = unique_options(*given)
        check_schedule(unique, job["run_at"], job["delay"])
    run_at, delay = schedule(job["run_at"], job["delay"])
    if unique is not None and unique.debounce is not None:
        delay = unique.debounce
    params: dict[str, Any] = {name: check(job[name]) for name, check in _SIMPLE_CHECKS}
    payload = validate.encode_payload(job["payload"], payload_limit)
    params["payload"] = payload if seal is None else seal(params["task"], payload)
    params["run_at"] = run_at
    params["delay"] = delay
    params["unique"] = unique
    params["reschedule"] = job["run_at"] is not None or job["delay"] is not None
    params["expires"], params["expires_in"] = validate.check_expires(job["expires"])
    depends_on = job["depends_on"]
    params["deps"] = None if depends_on is None else check_depends_on(depends_on, job["on_dead"])
    return params


def job_arrays(params_list: Sequence[Mapping[str, Any]], channel: str) -> dict[str, Any]:
    """The unnested-array parameters of insert_jobs: one array per option of the
    ``arrays`` path, under the option's name."""
    arrays: dict[str, Any] = {
        name: [p[name] for p in params_list] for name in ARRAY_OPTIONS + DERIVED_ARRAYS
    }
    arrays["channel"] = channel
    return arrays


#: copy_jobs' columns, in its order: the reserved id, then the columns of the copy path.
COPY_COLUMNS = (
    "id",
    "queue_name",
    "task",
    "payload",
    "priority",
    "base_priority",
    "available_at",
    "max_attempts",
    "payload_version",
    "idempotency_key",
    "key_policy",
    "limit_key",
    "expires_at",
    "fairness_key",
    "cost",
)


def copy_row(job_id: int, p: Mapping[str, Any], db_now: dt.datetime) -> tuple[Any, ...]:
    """One row of copy_jobs (:data:`COPY_COLUMNS`); a delay counts from the database
    clock ``db_now``."""
    delay = p["delay"]
    available = p["run_at"] or (db_now + dt.timedelta(seconds=delay) if delay else db_now)
    expires_in = p["expires_in"]
    expires = p["expires"] if expires_in is None else db_now + dt.timedelta(seconds=expires_in)
    return (
        job_id,
        p["queue"],
        p["task"],
        p["payload"],
        p["priority"],
        p["priority"],
        available,
        p["max_attempts"],
        p["payload_version"],
        p["idempotency_key"],
        p["key_policy"],
        p["limit_key"],
        expires,
        p["fairness_key"],
        p["cost"],
    )
