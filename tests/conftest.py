"""Test session setup: a real PostgreSQL, one fresh schema per test.

With ``LEASEQ_TEST_DSN`` set, tests use that server. Otherwise the session starts a
private cluster through leaseq's own embedded-server code (the same code users get when
they configure no DSN), in a data directory of its own, and stops it at the end if it
was not already running. A server already running in the default ``test-pg`` directory is
used as it is; otherwise the session's server lives in RAM when the machine has room
(``tests.support.scratch``) and is removed at the end.

Two ways to run the suite (both from the repository root):

    .venv/bin/python -m pytest                  # everything, slow tests included (what CI runs)
    .venv/bin/python -m pytest -m "not slow"    # the fast inner loop: no real-process crash
                                                # runs, chaos, PgBouncer or multi-host tests

A test that needs a program or privilege the machine lacks (``@pytest.mark.requires``,
see ``tests/support/requires.py``) is skipped, except under ``CI=true``, where it fails.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import shutil
import uuid
from collections.abc import AsyncIterator, Iterator

import psycopg
import pytest
from psycopg import sql

import leaseq
from leaseq.dev.embedded import EmbeddedServer, default_data_dir
from leaseq.errors import EmbeddedError
from tests.support.requires import check_marks
from tests.support.scratch import scratch_parent


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """``@pytest.mark.requires(...)``: skip, or fail under CI, before any fixture runs."""
    check_marks(item)


#: The test server grows (WAL, many schemas): RAM is used for it only with this much room.
_SERVER_MIN_FREE = 4 * 1024**3


#: The RAM directory this session chose for its test server, if it chose one.
_in_ram: list[pathlib.Path] = []


def _test_data_dir() -> pathlib.Path:
    """``LEASEQ_TEST_EMBEDDED_DIR``; else ``test-pg`` beside the development server's data
    directory when a server already runs there (it is shared, not duplicated); else a
    directory in RAM when there is room (``tests.support.scratch``: every commit of the
    suite would otherwise wait for the disk), else that ``test-pg``."""
    configured = os.environ.get("LEASEQ_TEST_EMBEDDED_DIR")
    if configured:
        return pathlib.Path(configured)
    default = default_data_dir().parent / "test-pg"
    ram = scratch_parent(_SERVER_MIN_FREE)
    if ram is None:
        return default
    with contextlib.suppress(EmbeddedError):
        if EmbeddedServer(default).status().running:
            return default
    _in_ram.append(ram / f"leaseq-test-pg-{os.geteuid()}")
    return _in_ram[-1]


#: Set by the session's controlling process (the only process without ``-n``): whether the
#: test server ran before the session began, so that only then it is left running.
_server_was_running: list[bool] = []


def _is_xdist_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def pytest_configure(config: pytest.Config) -> None:
    """One test server for the whole session: leaseq's own pytest plugin (the testing kit)
    and the CLI tests find it through ``LEASEQ_TEST_EMBEDDED_DIR``. With ``-n N``
    (pytest-xdist) the workers share it: any of them starts it on first use (starting is
    safe to race), and only the controlling process stops it, after every worker ended."""
    if "LEASEQ_TEST_DSN" in os.environ or _is_xdist_worker(config):
        return
    data_dir = _test_data_dir()
    os.environ["LEASEQ_TEST_EMBEDDED_DIR"] = str(data_dir)
    with contextlib.suppress(EmbeddedError):
        _server_was_running.append(EmbeddedServer(data_dir).status().running)


def pytest_unconfigure(config: pytest.Config) -> None:
    """The controlling process stops the server this session started, and removes it from
    RAM (workers never stop it: another may still be using it)."""
    if "LEASEQ_TEST_DSN" in os.environ or _is_xdist_worker(config):
        return
    if not _server_was_running or _server_was_running[0]:
        return
    data_dir = pathlib.Path(os.environ["LEASEQ_TEST_EMBEDDED_DIR"])
    with contextlib.suppress(EmbeddedError):
        EmbeddedServer(data_dir).stop()
    if data_dir in _in_ram:
        shutil.rmtree(data_dir, ignore_errors=True)  # nothing of it stays in RAM
        data_dir.with_name(data_dir.name + ".lock").unlink(missing_ok=True)


@pytest.fixture(scope="session")
def dsn() -> str:
    configured = os.environ.get("LEASEQ_TEST_DSN")
    if configured:
        return configured
    # Started on first use by whichever process needs it; stopped by pytest_unconfigure.
    return EmbeddedServer(
        pathlib.Path(os.environ["LEASEQ_TEST_EMBEDDED_DIR"]), port_from_env=False
    ).ensure_running()


@pytest.fixture(scope="session")
def leaseq_server_dsn(dsn: str) -> str:
    """The testing kit's server (leaseq's pytest plugin) is the session's test server, so
    the session that starts it also stops it."""
    return dsn


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
def second_client(dsn: str) -> Iterator[leaseq.Client]:
    """A client of a second migrated schema of the same database, dropped afterwards."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    c = leaseq.Client(dsn, schema=name)
    c.migrate()
    yield c
    c.close()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


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
