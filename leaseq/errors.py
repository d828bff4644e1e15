"""Exceptions leaseq raises, and the ones handlers raise to steer the failure policy.

Every error leaseq raises on bad input derives from :class:`LeaseqError` and carries a
message meant to be shown to a person as one line (the CLI prints exactly that line).
"""

from __future__ import annotations

import re


class LeaseqError(Exception):
    """Base class of every error leaseq raises on purpose."""


class ConfigError(LeaseqError):
    """A setting, argument or name is not acceptable (bad queue name, zero lease, ...)."""


class PayloadError(LeaseqError):
    """A payload cannot be stored: not JSON-serialisable, or larger than the limit."""


class EncryptionError(LeaseqError):
    """A sealed value cannot be opened: its key is missing, or it does not authenticate.
    ``code`` is the ErrorCode a job that meets it ends dead with."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class DatabaseUnavailable(LeaseqError):
    """The database cannot be reached (bad DSN, server down, authentication refused)."""


class SchemaError(LeaseqError):
    """The database schema is missing, or newer than this version of leaseq understands."""


def missing_schema_of(exc: BaseException) -> str | None:
    """The schema a "relation/schema does not exist" error names, or None when the missing
    relation is not schema-qualified (one of the caller's own, say)."""
    primary = getattr(getattr(exc, "diag", None), "message_primary", None) or str(exc)
    found = re.match(r'(?:relation|schema) "([^".]+)(?:\.[^"]*)?" does not exist', primary)
    return found.group(1) if found else None


def schema_missing(schema: str) -> SchemaError:
    """The one message for a schema that was never migrated, wherever it shows (the
    client's statements, the CLI, the worker's start, the integrations)."""
    return SchemaError(
        f"schema {schema!r} is not set up in this database; run `leaseq migrate`"
        + (f" (with --schema {schema})" if schema != "leaseq" else "")
    )


class IsolationLevelError(LeaseqError):
    """A caller's connection runs at an isolation level other than READ COMMITTED, which
    leaseq's statements need (they lock rows, then decide with a new snapshot). Raised
    before anything is written; the caller's transaction is still usable."""


class EmbeddedError(LeaseqError):
    """The embedded PostgreSQL could not be found, started or stopped."""


class JobNotFound(LeaseqError):
    """No job with the given id exists."""


class InvalidTransition(LeaseqError):
    """The requested operator action does not apply to the job's current state."""


class UniqueConflict(LeaseqError):
    """An enqueue with ``on_conflict="raise"`` found its unique key held. Nothing was stored
    and no SQL error was raised, so the caller's transaction is still usable."""

    def __init__(self, key: str, job_id: int, state: str) -> None:
        super().__init__(f"unique key {key!r} is held by job {job_id} ({state})")
        self.key = key
        self.job_id = job_id
        self.state = state


class ReplayRefused(InvalidTransition):
    """A replay would bring back a job whose unique key another job holds; the job stays as
    it was and the refusal is in its audit trail (``replay_refused``)."""

    def __init__(self, job_id: int, key: str, holder: int | None) -> None:
        by = f"job {holder}" if holder is not None else "another job"
        super().__init__(f"replay of job {job_id} refused: unique key {key!r} is held by {by}")
        self.job_id = job_id
        self.key = key
        self.holder = holder


class Permanent(Exception):
    """Raised by a handler: this failure will not improve with retries; the job goes dead.

    ``code`` is a short stable identifier stored in ``last_error_code``.
    """

    def __init__(self, code: str, detail: str | None = None) -> None:
        super().__init__(f"{code}: {detail}" if detail else code)
        self.code = code
        self.detail = detail


class Retry(Exception):
    """Raised by a handler: a transient failure; retry (after ``retry_in`` seconds if given)."""

    def __init__(
        self, code: str, detail: str | None = None, *, retry_in: float | None = None
    ) -> None:
        super().__init__(f"{code}: {detail}" if detail else code)
        self.code = code
        self.detail = detail
        self.retry_in = retry_in


class ResultTimeout(LeaseqError):
    """``result()`` waited its whole timeout and the job had not ended."""


class JobFailed(LeaseqError):
    """``result()``: the job ended without a result. ``status`` is dead or cancelled,
    ``error_code`` / ``detail`` its last failure (or why it was cancelled)."""

    def __init__(self, job_id: int, status: str, error_code: str | None, detail: str | None):
        self.job_id, self.status, self.error_code, self.detail = job_id, status, error_code, detail
        last = ((detail or "").strip().splitlines() or [""])[-1].strip()
        tail = f": {last}" if last else ""
        super().__init__(f"job {job_id} ended {status} ({error_code or 'no code'}){tail}")


class JobDead(JobFailed):
    """``result()``: the job ended dead."""


class JobCancelled(JobFailed):
    """``result()``: the job ended cancelled (by an operator, or a failed dependency)."""


#: The SQLSTATEs the SQL API refuses with (class LQ, docs/sql-api.md), and the error each
#: stands for; the message is the one-line message the client's check gives.
SQLSTATES: dict[str, type[LeaseqError]] = {
    "LQ000": LeaseqError,
    "LQ001": ConfigError,
    "LQ002": PayloadError,
    "LQ003": UniqueConflict,
}
