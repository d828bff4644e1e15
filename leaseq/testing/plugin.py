"""The pytest plugin of leaseq's testing kit (entry point ``pytest11: leaseq``). Every
fixture is named ``leaseq_*``; none runs unless a test asks for it.

``leaseq_server_dsn`` (session): ``LEASEQ_TEST_DSN``, or the embedded PostgreSQL in
``LEASEQ_TEST_EMBEDDED_DIR`` (default: ``test-pg`` beside the development server's data
directory), started if needed and stopped at the end if this session started it.
``leaseq_schema`` (session, override to change): the schema leaseq lives in, ``leaseq``.
``leaseq_dsn``: a fresh database for this test, cloned from a migrated template, its DSN
carrying the test clock; ``leaseq_client``, ``leaseq_clock`` and ``leaseq_testing`` (a
:class:`leaseq.testing.Kit`) work on it.
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Iterator

import pytest

from leaseq.client import Client
from leaseq.dev.embedded import EmbeddedServer, default_data_dir
from leaseq.testing import Kit
from leaseq.testing.clock import Clock
from leaseq.testing.database import clone, database_dsn, drop_database, ensure_template


def _embedded_dir() -> pathlib.Path:
    configured = os.environ.get("LEASEQ_TEST_EMBEDDED_DIR")
    return pathlib.Path(configured) if configured else default_data_dir().parent / "test-pg"


@pytest.fixture(scope="session")
def leaseq_server_dsn() -> Iterator[str]:
    configured = os.environ.get("LEASEQ_TEST_DSN")
    if configured:
        yield configured
        return
    server = EmbeddedServer(_embedded_dir())
    was_running = server.status().running
    url = server.ensure_running()
    yield url
    if not was_running:
        server.stop()


@pytest.fixture(scope="session")
def leaseq_schema() -> str:
    return "leaseq"


@pytest.fixture(scope="session")
def leaseq_template(leaseq_server_dsn: str, leaseq_schema: str) -> str:
    return ensure_template(leaseq_server_dsn, leaseq_schema)


@pytest.fixture()
def leaseq_dsn(leaseq_server_dsn: str, leaseq_template: str) -> Iterator[str]:
    name = clone(leaseq_server_dsn, leaseq_template)
    yield database_dsn(leaseq_server_dsn, name)
    drop_database(leaseq_server_dsn, name)


@pytest.fixture()
def leaseq_client(leaseq_dsn: str, leaseq_schema: str) -> Iterator[Client]:
    client = Client(leaseq_dsn, schema=leaseq_schema)
    yield client
    client.close()


@pytest.fixture()
def leaseq_clock(leaseq_dsn: str) -> Clock:
    return Clock(leaseq_dsn)


@pytest.fixture()
def leaseq_testing(leaseq_client: Client, leaseq_clock: Clock) -> Kit:
    return Kit(leaseq_client, leaseq_clock)
