"""LISTEN for enqueue notifications. Only a wake-up: the table stays the truth, and the
worker polls on its own schedule whether or not this connection is alive.

A payload is a queue name, or ``WAKE_ALL`` ("*", never a valid queue name), sent when a task
or ordering-key pause is resumed: that may free work in any queue."""

from __future__ import annotations

import asyncio
import logging
import time

import psycopg
from psycopg import sql

from leaseq.client_async import AsyncClient
from leaseq.errors import LeaseqError
from leaseq.retry import backoff
from leaseq.worker.outage import first_line

log = logging.getLogger("leaseq.worker")

#: application_name of listener connections, so operators (and tests) can find them.
LISTENER_APPLICATION_NAME = "leaseq-listener"
#: The payload that wakes every listener (pauses.sql: resume_scope).
WAKE_ALL = "*"


class Listener:
    def __init__(
        self,
        client: AsyncClient,
        queues: frozenset[str],
        wake: asyncio.Event,
        *,
        dsn: str | None = None,
    ) -> None:
        """``dsn``: LISTEN on a direct connection to PostgreSQL (e.g. bypassing a PgBouncer
        in transaction pooling mode, which cannot keep a LISTEN); default: the client's."""
        self._client = client
        self._dsn = dsn
        self._queues = queues
        self._wake = wake
        self.connected = False
        self.notifications = 0
        self._last_warning = -3600.0

    async def _connect(self) -> psycopg.AsyncConnection[tuple[object, ...]]:
        if self._dsn is None:
            return await self._client.connect(
                autocommit=True, application_name=LISTENER_APPLICATION_NAME
            )
        return await psycopg.AsyncConnection.connect(
            self._dsn, autocommit=True, application_name=LISTENER_APPLICATION_NAME
        )

    async def run(self) -> None:
        failures = 0
        delay = 0.1
        while True:
            try:
                conn = await self._connect()
                try:
                    await conn.execute(
                        sql.SQL("LISTEN {}").format(sql.Identifier(self._client.channel))
                    )
                    self.connected = True
                    failures, delay = 0, 0.1
                    # Something may have been enqueued while we were not listening.
                    self._wake.set()
                    async for note in conn.notifies():
                        self.notifications += 1
                        if note.payload in self._queues or note.payload == WAKE_ALL:
                            self._wake.set()
                finally:
                    self.connected = False
                    await conn.close()
            except (psycopg.Error, LeaseqError, OSError) as exc:
                # Warn at most once a minute: a flapping connection must not flood the log.
                now = time.monotonic()
                level = logging.WARNING if now - self._last_warning > 60 else logging.DEBUG
                if level == logging.WARNING:
                    self._last_warning = now
                log.log(
                    level,
                    "listener disconnected (%s); polling continues, reconnecting in %.1fs",
                    first_line(exc),
                    delay,
                )
            await asyncio.sleep(delay)
            failures += 1
            delay = backoff(failures + 1, base=0.1, cap=10.0, jitter=0.5)
