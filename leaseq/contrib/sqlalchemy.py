"""SQLAlchemy (extra ``leaseq[sqlalchemy]``): the psycopg connection inside a Session's
transaction, to pass as ``connection=`` to any client call, so a job exists (and workers
are woken) only if the session commits.

Works with the psycopg 3 dialect (``postgresql+psycopg://``), sync and async. leaseq never
commits, rolls back or changes autocommit on that connection: the session owns it.

``sqlalchemy.ext.asyncio`` is only named for the type checker: it needs greenlet, which
SQLAlchemy 2.1 no longer installs, and sync use must import without it (async use needs
``sqlalchemy[asyncio]``, which the caller's own AsyncSession already imported).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import psycopg
from sqlalchemy.orm import Session

from leaseq.errors import ConfigError

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession


def _psycopg(driver: Any, kind: type[Any]) -> Any:
    if not isinstance(driver, kind):
        raise ConfigError(
            f"leaseq needs the psycopg 3 driver (postgresql+psycopg://), "
            f"this session uses {type(driver).__module__}.{type(driver).__name__}"
        )
    return driver


def connection_for(session: Session) -> psycopg.Connection[Any]:
    """The psycopg connection of ``session``'s transaction (begun if it was not yet)."""
    driver = session.connection().connection.driver_connection
    conn: psycopg.Connection[Any] = _psycopg(driver, psycopg.Connection)
    return conn


async def async_connection_for(session: AsyncSession) -> psycopg.AsyncConnection[Any]:
    """The psycopg async connection of ``session``'s transaction (begun if needed)."""
    raw = await (await session.connection()).get_raw_connection()
    conn: psycopg.AsyncConnection[Any] = _psycopg(raw.driver_connection, psycopg.AsyncConnection)
    return conn
