"""Where the database is: an explicit DSN, else ``LEASEQ_DSN``, else the embedded server."""

from __future__ import annotations

import os

from psycopg.conninfo import conninfo_to_dict

from leaseq.errors import ConfigError

ENV_DSN = "LEASEQ_DSN"


def resolve_dsn(dsn: str | None = None) -> str:
    if dsn:
        return dsn
    from_env = os.environ.get(ENV_DSN, "").strip()
    if from_env:
        return from_env
    # Imported late: starting a private server is the fallback, not the normal path.
    from leaseq.dev.embedded import embedded_dsn

    return embedded_dsn()


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
