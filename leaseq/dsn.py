"""Where the database is: an explicit DSN, else ``LEASEQ_DSN``, else the embedded server.

Falling back to the embedded server is for ``leaseq demo``, the tests and development. A
production worker that lost its configuration must not quietly serve an empty private
queue, so the fallback says so, once per process, on stderr (a logging warning naming the
data directory and ``LEASEQ_DSN``). A DSN of ``embedded`` asks for that server explicitly
and silently.

A DSN naming several hosts (``host=a,b``) is how a client follows a failover, but only with
``target_session_attrs=read-write`` (or ``primary``): without it libpq may settle on a
standby or a demoted primary, where every write fails. That also gets a warning, once.
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
_warned_multi_host: set[str] = set()
#: target_session_attrs values under which libpq connects only to a writable server.
_WRITABLE = frozenset({"read-write", "primary"})


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


def multi_host_problem(dsn: str) -> str | None:
    """Why a DSN naming several hosts may connect to a server that takes no writes (a
    standby, a demoted primary), or None when it names one host or asks for a writable one."""
    try:
        parts = conninfo_to_dict(dsn)
    except Exception:
        return None  # a bad DSN gets its own error when connecting
    hosts = str(parts.get("host") or parts.get("hostaddr") or "")
    if "," not in hosts:
        return None
    attrs = str(parts.get("target_session_attrs") or os.environ.get("PGTARGETSESSIONATTRS", ""))
    if attrs in _WRITABLE:
        return None
    return (
        f"the DSN names several hosts ({describe_dsn(dsn)}) without "
        "target_session_attrs=read-write (or primary): after a failover it may connect to "
        "a read-only server; add target_session_attrs=read-write"
    )


def warn_multi_host(dsn: str) -> None:
    """Log :func:`multi_host_problem`, once per DSN and process."""
    problem = multi_host_problem(dsn)
    if problem is not None and dsn not in _warned_multi_host:
        _warned_multi_host.add(dsn)
        log.warning("%s", problem)
