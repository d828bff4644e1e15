"""Failure policy: how failures are classified, and how long to wait before a retry.

Pure: no I/O, and the random source is passed in, so tests can pin it exactly.

- **Classes.** ``permanent`` failures will not improve (bad payload, unsupported version):
  the job goes dead at once. ``transient`` ones may (timeouts, a dependency down): retried
  with back-off up to the job's ``max_attempts``. ``unknown`` ones (an exception nobody
  classified) get a small separate budget, ``unknown_attempts``, and full diagnostics.
- **Back-off.** Exponential with full jitter: ``uniform(0, min(cap, base * factor**(n-1)))``
  after attempt ``n``. A handler's ``retry_in`` wins, but never beyond ``cap``.
- **Time budget.** With ``max_elapsed``, no retry is scheduled to start later than that many
  seconds after the job was enqueued: the job goes dead instead.
"""

from __future__ import annotations

import enum
import random
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import psycopg

from leaseq.errors import ConfigError, DatabaseUnavailable, Permanent, Retry


class ErrorClass(enum.StrEnum):
    PERMANENT = "permanent"
    TRANSIENT = "transient"
    UNKNOWN = "unknown"


def backoff(
    attempt: int,
    *,
    base: float,
    cap: float,
    factor: float = 2.0,
    jitter: float = 1.0,
    rng: Callable[[], float] = random.random,
) -> float:
    """The one back-off formula: ``ceiling = min(cap, base * factor**(attempt-1))``, then a
    delay drawn uniformly from ``[ceiling * (1 - jitter), ceiling]`` (``jitter=1`` is full
    jitter, ``0.5`` keeps at least half, ``0`` none). ``attempt`` counts from 1; overflow-safe.
    Job retries (``RetryPolicy``), outage reconnects, the listener and the supervisor use it."""
    exponent = max(0, attempt - 1)
    ceiling = cap if exponent > 1000 else float(min(cap, base * factor**exponent))
    return ceiling * (1.0 - jitter * rng())


#: Exception-type → class rules, as a mapping or (type, class) pairs; first match wins.
ErrorRules = Mapping[type[BaseException], str] | Iterable[tuple[type[BaseException], str]]


@dataclass(frozen=True)
class RetryPolicy:
    """Back-off and budgets for retries; see the module docstring."""

    base: float = 2.0
    factor: float = 2.0
    cap: float = 600.0
    max_elapsed: float | None = None
    unknown_attempts: int = 3
    rng: Callable[[], float] = field(default=random.random, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not (self.base > 0 and self.factor >= 1 and self.cap >= self.base):
            raise ConfigError(
                f"invalid retry policy: need base > 0, factor >= 1, cap >= base "
                f"(got base={self.base}, factor={self.factor}, cap={self.cap})"
            )
        if self.max_elapsed is not None and not self.max_elapsed > 0:
            raise ConfigError(f"max_elapsed must be more than 0 seconds, got {self.max_elapsed}")
        if isinstance(self.unknown_attempts, bool) or not (
            isinstance(self.unknown_attempts, int) and self.unknown_attempts >= 1
        ):
            raise ConfigError(f"unknown_attempts must be at least 1, got {self.unknown_attempts}")

    def ceiling(self, attempt: int) -> float:
        """Largest delay the policy may choose after ``attempt`` failed."""
        return backoff(attempt, base=self.base, cap=self.cap, factor=self.factor, jitter=0.0)

    def delay(self, attempt: int, retry_in: float | None = None) -> float:
        if retry_in is not None:
            return float(min(max(0.0, retry_in), self.cap))
        return self.ceiling(attempt) * self.rng()


def _rules(rules: ErrorRules | None) -> list[tuple[type[BaseException], ErrorClass]]:
    if rules is None:
        return []
    pairs = rules.items() if isinstance(rules, Mapping) else rules
    checked = []
    for exc_type, cls in pairs:
        if not (isinstance(exc_type, type) and issubclass(exc_type, BaseException)):
            raise ConfigError(f"error rule keys must be exception types, got {exc_type!r}")
        try:
            checked.append((exc_type, ErrorClass(cls)))
        except ValueError:
            raise ConfigError(
                f"error class must be permanent, transient or unknown, got {cls!r}"
            ) from None
    return checked


#: After the task's and the app's own rules: losing the database mid-handler (an outage, a
#: restart, a terminated backend) is transient, not a bug in the handler.
DEFAULT_RULES: tuple[tuple[type[BaseException], ErrorClass], ...] = (
    (psycopg.OperationalError, ErrorClass.TRANSIENT),
    (DatabaseUnavailable, ErrorClass.TRANSIENT),
)


@dataclass(frozen=True)
class Classifier:
    """Maps an exception to (class, code): explicit ``Permanent``/``Retry`` first, then the
    task's rules, then the app's, then database connectivity errors as transient, else
    ``unknown``. The code is the exception's own code,
    or its type name."""

    task_rules: tuple[tuple[type[BaseException], ErrorClass], ...] = ()
    app_rules: tuple[tuple[type[BaseException], ErrorClass], ...] = ()

    @classmethod
    def build(cls, task_rules: ErrorRules | None, app_rules: ErrorRules | None) -> Classifier:
        return cls(tuple(_rules(task_rules)), tuple(_rules(app_rules)))

    def classify(self, exc: BaseException) -> tuple[ErrorClass, str]:
        if isinstance(exc, Permanent):
            return ErrorClass.PERMANENT, exc.code
        if isinstance(exc, Retry):
            return ErrorClass.TRANSIENT, exc.code
        for exc_type, error_class in (*self.task_rules, *self.app_rules, *DEFAULT_RULES):
            if isinstance(exc, exc_type):
                return error_class, type(exc).__name__
        return ErrorClass.UNKNOWN, type(exc).__name__
