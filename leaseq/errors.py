"""Exceptions leaseq raises, and the ones handlers raise to steer the failure policy.

Every error leaseq raises on bad input derives from :class:`LeaseqError` and carries a
message meant to be shown to a person as one line (the CLI prints exactly that line).
"""

from __future__ import annotations


class LeaseqError(Exception):
    """Base class of every error leaseq raises on purpose."""


class ConfigError(LeaseqError):
    """A setting, argument or name is not acceptable (bad queue name, zero lease, ...)."""


class PayloadError(LeaseqError):
    """A payload cannot be stored: not JSON-serialisable, or larger than the limit."""


class DatabaseUnavailable(LeaseqError):
    """The database cannot be reached (bad DSN, server down, authentication refused)."""


class SchemaError(LeaseqError):
    """The database schema is missing, or newer than this version of leaseq understands."""


class EmbeddedError(LeaseqError):
    """The embedded PostgreSQL could not be found, started or stopped."""


class JobNotFound(LeaseqError):
    """No job with the given id exists."""


class InvalidTransition(LeaseqError):
    """The requested operator action does not apply to the job's current state."""


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
