"""Test session setup: a real PostgreSQL, one fresh schema per test.

With ``LEASEQ_TEST_DSN`` set, tests use that server. Otherwise the session starts a
private cluster through leaseq's own embedded-server code (the same code users get when
they configure no DSN), in a data directory of its own, and stops it at the end if it
was not already running.

Two ways to run the suite (both from the repository root):

    .venv/bin/python -m pytest                  # everything, slow tests included (what CI runs)
    .venv/bin/python -m pytest -m "not slow"    # the fast inner loop: no real-process crash
                                                # runs, chaos, PgBouncer or multi-host tests

A test that needs a program or privilege the machine lacks (``@pytest.mark.requires``,
see ``tests/support/requires.py``) is skipped, except under ``CI=true``, where it fails.
"""

from __future__ import annotations

import os
import pathlib
import uuid
from collections.abc import AsyncIterator, Iterator

import psycopg
import pytest
from psycopg import sql

import leaseq
from leaseq.dev.embedded import EmbeddedServer, default_data_dir
from tests.support.requires import check_marks


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """``@pytest.mark.requires(...)``: skip, or fail under CI, before any fixture runs."""
    check_marks(item)


def _test_data_dir() -> pathlib.Path:
    configured = os.environ.get("LEASEQ_TEST_EMBEDDED_DIR")
    if configured:
        return pathlib.Path(configured)
    return default_data_dir().parent / "test-pg"


@pytest.fixture(scope="session")
def dsn() -> Iterator[str]:
    configured = os.environ.get("LEASEQ_TEST_DSN")
    if configured:
        yield configured
        return
    server = EmbeddedServer(_test_data_dir())
    was_running = server.status().running
    url = server.ensure_running()
    yield url
    if not was_running:
        server.stop()


@pytest.fixture()
def schema(dsn: str) -> Iterator[str]:
    """A schema name unique to this test, dropped afterwards."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    yield name
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


@pytest.fixture()
def client(dsn: str, schema: str) -> Iterator[leaseq.Client]:
    c = leaseq.Client(dsn, schema=schema)
    c.migrate()
    yield c
    c.close()


@pytest.fixture()
async def aclient(dsn: str, schema: str) -> AsyncIterator[leaseq.AsyncClient]:
    c = leaseq.AsyncClient(dsn, schema=schema)
    await c.migrate()
    yield c
    await c.close()


@pytest.fixture()
def conn(dsn: str) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    """A plain autocommit connection for looking behind the API."""
    with psycopg.connect(dsn, autocommit=True) as c:
        yield c
