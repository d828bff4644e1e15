"""Where the database is: an explicit DSN, else ``LEASEQ_DSN``, else the embedded server.

Falling back to the embedded server is for ``leaseq demo``, the tests and development. A
production worker that lost its configuration must not quietly serve an empty private
queue, so the fallback says so, once per process, on stderr (a logging warning naming the
data directory and ``LEASEQ_DSN``). A DSN of ``embedded`` asks for that server explicitly
and silently.
"""

from __future__ import annotations

import logging
import os

from psycopg.conninfo import conninfo_to_dict

from leaseq.errors import ConfigError

ENV_DSN = "LEASEQ_DSN"
#: The DSN (argument or ``LEASEQ_DSN``) that opts in to the embedded server.
EMBEDDED = "embedded"

log = logging.getLogger("leaseq.dsn")
_warned = False


def resolve_dsn(dsn: str | None = None) -> str:
    dsn = (dsn or "").strip() or os.environ.get(ENV_DSN, "").strip()
    if dsn and dsn != EMBEDDED:
        return dsn
    # Imported late: starting a private server is the fallback, not the normal path.
    from leaseq.dev.embedded import default_data_dir, embedded_dsn

    if not dsn:
        _warn_fallback(str(default_data_dir()))
    return embedded_dsn()


def _warn_fallback(data_dir: str) -> None:
    global _warned
    if _warned:
        return
    _warned = True
    log.warning(
        "no database configured: using the embedded development PostgreSQL in %s; "
        "set %s (or --dsn) to your server, or %s=%s to silence this",
        data_dir,
        ENV_DSN,
        ENV_DSN,
        EMBEDDED,
    )


def describe_dsn(dsn: str) -> str:
    """The DSN without its password, for messages and logs."""
    try:
        parts = conninfo_to_dict(dsn)
    except Exception:
        raise ConfigError("the DSN is not a valid PostgreSQL connection string") from None
    host = parts.get("host") or "localhost"
    port = parts.get("port") or "5432"
    user = parts.get("user")
    dbname = parts.get("dbname") or user or ""
    who = f"{user}@" if user else ""
    return f"postgresql://{who}{host}:{port}/{dbname}"
