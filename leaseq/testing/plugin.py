"""The pytest plugin of leaseq's testing kit (entry point ``pytest11: leaseq``). Every
fixture is named ``leaseq_*``; none runs unless a test asks for it.

``leaseq_server_dsn`` (session): ``LEASEQ_TEST_DSN``, or the embedded PostgreSQL in
``LEASEQ_TEST_EMBEDDED_DIR`` (default: ``test-pg`` beside the development server's data
directory), started if needed and stopped at the end if this session started it; it never
takes ``LEASEQ_EMBEDDED_PORT`` (the development server's port).
``leaseq_schema`` (session, override to change): the schema leaseq lives in, ``leaseq``.
``leaseq_dsn``: a fresh database for this test, cloned from a migrated template, its DSN
carrying the test clock; ``leaseq_client``, ``leaseq_clock`` and ``leaseq_testing`` (a
:class:`leaseq.testing.Kit`) work on it. ``leaseq_use``: ``leaseq_use(app)`` points an
application's own App at that database for this test (its clients made anew, sync and
async) and puts the App back afterwards.
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Callable, Iterator

import pytest

from leaseq.app import App
from leaseq.client import Client
from leaseq.dev.embedded import EmbeddedServer, default_data_dir
from leaseq.testing import Kit
from leaseq.testing.clock import Clock
from leaseq.testing.database import clone, database_dsn, drop_database, ensure_template


def _embedded_dir() -> pathlib.Path:
    configured = os.environ.get("LEASEQ_TEST_EMBEDDED_DIR")
    return pathlib.Path(configured) if configured else default_data_dir().parent / "test-pg"


def test_server(data_dir: pathlib.Path) -> EmbeddedServer:
    """The kit's own server: LEASEQ_EMBEDDED_PORT is the development server's port, so the
    test server never takes it (it keeps the port it recorded, or a free one)."""
    return EmbeddedServer(data_dir, port_from_env=False)


test_server.__test__ = False  # type: ignore[attr-defined]  # not a test, whatever pytest thinks


@pytest.fixture(scope="session")
def leaseq_server_dsn() -> Iterator[str]:
    configured = os.environ.get("LEASEQ_TEST_DSN")
    if configured:
        yield configured
        return
    server = test_server(_embedded_dir())
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


@pytest.fixture()
def leaseq_use(leaseq_dsn: str, leaseq_schema: str) -> Iterator[Callable[[App], App]]:
    used: list[tuple[App, str | None, str]] = []

    def use(app: App) -> App:
        if not isinstance(app, App):
            raise TypeError(f"leaseq_use takes a leaseq.App, got {type(app).__name__}")
        used.append((app, app.dsn, app.schema))
        app.close()
        app.schema = leaseq_schema
        app.dsn = leaseq_dsn  # the setter drops the clients of the previous database
        return app

    yield use
    for app, dsn, schema in reversed(used):
        app.close()
        app.schema = schema
        app.dsn = dsn
