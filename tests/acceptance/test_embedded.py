"""The embedded PostgreSQL against the real server binaries on this machine.

Every cluster lives in a scratch directory under /var/tmp (not the default directory, which a
developer may be using) and gets an explicit free port, so these tests never take DEFAULT_PORT
from a real embedded server. /var/tmp rather than pytest's tmp_path because, as root, the server
runs as an unprivileged account that cannot enter /tmp/pytest-of-root (mode 700).
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from leaseq.dev.embedded import (
    DEFAULT_PORT,
    EmbeddedServer,
    default_data_dir,
    find_bindir,
)
from leaseq.errors import EmbeddedError
from tests.support.ports import free_port
from tests.support.scratch import make_scratch

REPO = pathlib.Path(__file__).resolve().parents[2]
_ENV_VARS = ("LEASEQ_EMBEDDED_DIR", "LEASEQ_EMBEDDED_PORT", "LEASEQ_PG_BINDIR")


needs_pg = pytest.mark.requires("postgres-server")


def _scratch_dir() -> pathlib.Path:
    return make_scratch("leaseq-test-")  # the server account can pass through it


def _cleanup(scratch: pathlib.Path) -> None:
    data_dir = scratch / "pg"
    if (data_dir / "PG_VERSION").exists():
        with contextlib.suppress(EmbeddedError):
            EmbeddedServer(data_dir).stop()
    shutil.rmtree(scratch, ignore_errors=True)


def _listen_on(port: int) -> socket.socket:
    """A real occupant of the port, as another program's server would be."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen()
    return sock


def _wait_until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.05)


def _query(dsn: str, sql: str) -> Any:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(sql).fetchone()
        assert row is not None
        return row[0]


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in _ENV_VARS:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def scratch() -> Iterator[pathlib.Path]:
    path = _scratch_dir()
    try:
        yield path
    finally:
        _cleanup(path)


@pytest.fixture(scope="module")
def shared() -> Iterator[EmbeddedServer]:
    """One cluster for the lifecycle tests; initdb per test would dominate the run time."""
    path = _scratch_dir()
    try:
        with pytest.MonkeyPatch.context() as mp:
            for name in _ENV_VARS:
                mp.delenv(name, raising=False)
            yield EmbeddedServer(path / "pg", port=free_port())
    finally:
        _cleanup(path)


@needs_pg
def test_start_returns_working_dsn(shared: EmbeddedServer) -> None:
    dsn = shared.ensure_running()
    port = shared.status().port
    assert dsn == f"postgresql://leaseq@127.0.0.1:{port}/leaseq"
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
        row = conn.execute("SELECT current_user, current_database()").fetchone()
        assert row == ("leaseq", "leaseq")
        settings: dict[str, str] = dict(
            conn.execute(
                "SELECT name, setting FROM pg_settings WHERE name = ANY(%s)",
                (
                    [
                        "listen_addresses",
                        "max_connections",
                        "fsync",
                        "synchronous_commit",
                        "server_encoding",
                        "unix_socket_directories",
                    ],
                ),
            ).fetchall()
        )
    assert settings["listen_addresses"] == "127.0.0.1"
    assert settings["max_connections"] == "200"
    assert settings["fsync"] == "on"
    assert settings["synchronous_commit"] == "on"
    assert settings["server_encoding"] == "UTF8"
    # The Unix socket works too and sits in a directory private to the server's account.
    socket_dir = pathlib.Path(settings["unix_socket_directories"].strip('"'))
    assert socket_dir.stat().st_mode & 0o077 == 0
    with psycopg.connect(host=str(socket_dir), port=port, user="leaseq", dbname="leaseq") as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)


@needs_pg
def test_second_call_reuses_the_running_server(shared: EmbeddedServer) -> None:
    dsn = shared.ensure_running()
    pid = shared.status().pid
    assert pid is not None
    assert shared.ensure_running() == dsn
    # A fresh handle without a port finds the same server through the data directory.
    other = EmbeddedServer(shared.data_dir)
    assert other.ensure_running() == dsn
    assert other.dsn == dsn
    assert shared.status().pid == pid


@needs_pg
def test_status_reflects_running_and_stopped(shared: EmbeddedServer) -> None:
    dsn = shared.ensure_running()
    up = shared.status()
    assert up.running
    assert up.data_dir == shared.data_dir
    assert up.dsn == dsn
    assert up.pid is not None
    assert up.port is not None
    assert up.bindir is not None
    assert (up.bindir / "pg_ctl").exists()
    assert up.version is not None
    assert up.version == _query(dsn, "SHOW server_version").split(".")[0]

    assert shared.stop() is True
    down = shared.status()
    assert not down.running
    assert down.pid is None
    assert down.dsn is None
    assert down.port == up.port  # the recorded port
    assert shared.stop() is False
    with pytest.raises(EmbeddedError, match="not running"):
        _ = shared.dsn


@needs_pg
def test_restart_keeps_data(shared: EmbeddedServer) -> None:
    dsn = shared.ensure_running()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS kept")
        conn.execute("CREATE TABLE kept (x int)")
        conn.execute("INSERT INTO kept VALUES (42)")
    assert shared.stop()
    assert shared.ensure_running() == dsn
    assert _query(dsn, "SELECT x FROM kept") == 42


@needs_pg
def test_recovers_after_postmaster_is_killed(shared: EmbeddedServer) -> None:
    dsn = shared.ensure_running()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS survived (x int)")
        conn.execute("INSERT INTO survived VALUES (7)")
    pid = shared.status().pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    _wait_until(lambda: not shared.status().running)
    # postmaster.pid is still there, naming the dead (here: zombie) process.
    assert (shared.data_dir / "postmaster.pid").exists()

    assert shared.ensure_running() == dsn
    new_pid = shared.status().pid
    assert new_pid is not None
    assert new_pid != pid
    assert _query(dsn, "SELECT count(*) FROM survived WHERE x = 7") == 1


@needs_pg
def test_stale_pidfile_naming_a_reused_pid(shared: EmbeddedServer) -> None:
    """After a reboot the PID in postmaster.pid may belong to an unrelated live process."""
    shared.ensure_running()
    pidfile = shared.data_dir / "postmaster.pid"
    lines = pidfile.read_text().splitlines()
    port = int(lines[3])
    socket_dir = pathlib.Path(lines[4])
    shared.stop()
    impostor = subprocess.Popen(["sleep", "60"], cwd="/")
    try:
        lines[0] = str(impostor.pid)
        pidfile.write_text("\n".join(lines) + "\n")
        socket_lock = socket_dir / f".s.PGSQL.{port}.lock"
        socket_lock.write_text(f"{impostor.pid}\n{shared.data_dir}\n")
        assert not shared.status().running
        assert shared.ensure_running().endswith(f":{port}/leaseq")
        assert shared.status().pid != impostor.pid
        assert impostor.poll() is None  # we never signal a process that is not ours
    finally:
        impostor.kill()
        impostor.wait()


@needs_pg
def test_failed_start_points_at_the_log(shared: EmbeddedServer) -> None:
    shared.ensure_running()
    shared.stop()
    auto_conf = shared.data_dir / "postgresql.auto.conf"
    original = auto_conf.read_text()
    try:
        with auto_conf.open("a") as f:
            f.write("shared_buffers = 'plenty'\n")
        with pytest.raises(EmbeddedError) as info:
            shared.ensure_running()
        message = str(info.value)
        assert message.startswith("embedded PostgreSQL failed to start")
        assert message.endswith(f"see {shared.data_dir / 'server.log'}")
        assert "postgresql.auto.conf" in message
        assert "\n" not in message
    finally:
        auto_conf.write_text(original)
    shared.ensure_running()


@needs_pg
def test_recorded_port_taken_when_starting_moves_to_a_free_one(shared: EmbeddedServer) -> None:
    shared.ensure_running()
    port = shared.status().port
    assert port is not None
    shared.stop()
    occupant = _listen_on(port)
    try:
        dsn = EmbeddedServer(shared.data_dir).ensure_running()
    finally:
        occupant.close()
    moved = shared.status().port
    assert moved is not None and moved != port and dsn.endswith(f":{moved}/leaseq")
    assert _query(dsn, "SELECT 1") == 1
    # The new port is the recorded one from now on.
    shared.stop()
    assert EmbeddedServer(shared.data_dir).ensure_running().endswith(f":{moved}/leaseq")


@pytest.mark.slow  # several processes race to initdb one cluster
@needs_pg
def test_concurrent_start_on_fresh_dir(scratch: pathlib.Path) -> None:
    data_dir = scratch / "pg"
    port = free_port()
    # Each child imports first, then waits for a common instant, so the calls really overlap.
    start_at = time.time() + 1.5
    code = (
        "import sys, time\n"
        "from leaseq.dev.embedded import EmbeddedServer\n"
        "server = EmbeddedServer(sys.argv[1])\n"
        "time.sleep(max(0.0, float(sys.argv[2]) - time.time()))\n"
        "print(server.ensure_running())\n"
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        "LEASEQ_EMBEDDED_PORT": str(port),
    }
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(data_dir), repr(start_at)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(3)
    ]
    results = [proc.communicate(timeout=60) for proc in procs]
    for proc, (_, err) in zip(procs, results, strict=True):
        assert proc.returncode == 0, err
    dsns = {out.strip() for out, _ in results}
    assert dsns == {f"postgresql://leaseq@127.0.0.1:{port}/leaseq"}
    dsn = dsns.pop()
    assert _query(dsn, "SELECT 1") == 1
    # One cluster, one initdb: the log shows a single first start.
    log = (data_dir / "server.log").read_text()
    assert log.count("database system is ready to accept connections") == 1


@needs_pg
def test_new_cluster_avoids_busy_default_port(scratch: pathlib.Path) -> None:
    try:
        holder: socket.socket | None = _listen_on(DEFAULT_PORT)
    except OSError:
        holder = None  # something else already holds it, which serves the test just as well
    server = EmbeddedServer(scratch / "pg")
    try:
        dsn = server.ensure_running()
    finally:
        if holder is not None:
            holder.close()
    port = server.status().port
    assert port is not None
    assert port != DEFAULT_PORT
    assert _query(dsn, "SELECT 1") == 1
    # The cluster keeps the port it was given, even once the default is free again.
    server.stop()
    assert EmbeddedServer(scratch / "pg").ensure_running() == dsn


@needs_pg
def test_port_bound_by_plain_socket(scratch: pathlib.Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        with pytest.raises(EmbeddedError, match=rf"port {port} .*in use"):
            EmbeddedServer(scratch / "pg", port=port).ensure_running()
    # The check comes before initdb, so a busy port fails fast and leaves nothing behind.
    assert not (scratch / "pg" / "PG_VERSION").exists()


@needs_pg
def test_deep_data_dir_gets_a_short_socket_dir(scratch: pathlib.Path) -> None:
    # Unix socket paths are limited to about 100 bytes; the server must still come up.
    deep = scratch / ("d" * 60) / ("e" * 60) / "pg"
    deep.parent.parent.mkdir()
    deep.parent.parent.chmod(0o755)
    server = EmbeddedServer(deep, port=free_port())
    socket_dir: pathlib.Path | None = None
    try:
        dsn = server.ensure_running()
        socket_dir = pathlib.Path(_query(dsn, "SHOW unix_socket_directories").strip('"'))
        assert len(str(socket_dir)) < 90
        assert socket_dir.stat().st_mode & 0o077 == 0
        server.stop()
        # A restart reuses the same directory instead of littering the temp dir.
        assert _query(server.ensure_running(), "SHOW unix_socket_directories") == (
            f'"{socket_dir}"'
        )
    finally:
        server.stop()
        if socket_dir is not None:
            shutil.rmtree(socket_dir, ignore_errors=True)


@pytest.mark.requires("root")  # only root hands the cluster to another account
def test_root_refuses_unreachable_dir(scratch: pathlib.Path) -> None:
    closed = scratch / "closed"
    closed.mkdir(mode=0o700)
    with pytest.raises(EmbeddedError, match="not reachable by the server account"):
        EmbeddedServer(closed / "pg", port=free_port()).ensure_running()


def test_bad_port_settings(scratch: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(EmbeddedError, match="port number"):
        EmbeddedServer(scratch / "pg", port=70000)
    monkeypatch.setenv("LEASEQ_EMBEDDED_PORT", "five")
    with pytest.raises(EmbeddedError, match="LEASEQ_EMBEDDED_PORT"):
        EmbeddedServer(scratch / "pg").ensure_running()


def test_bindir_without_binaries(scratch: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    empty = scratch / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("LEASEQ_PG_BINDIR", str(empty))
    with pytest.raises(EmbeddedError, match=r"binaries \(initdb, pg_ctl\) not found"):
        find_bindir()
    with pytest.raises(EmbeddedError, match="not found"):
        EmbeddedServer(scratch / "pg", port=free_port()).ensure_running()
    status = EmbeddedServer(scratch / "pg").status()
    assert not status.running
    assert status.bindir is None


def test_default_data_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path) -> None:
    monkeypatch.setenv("LEASEQ_EMBEDDED_DIR", str(tmp_path / "custom"))
    assert default_data_dir() == tmp_path / "custom"
    monkeypatch.delenv("LEASEQ_EMBEDDED_DIR")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    if os.geteuid() == 0:
        path = default_data_dir()
        assert not path.is_relative_to("/root")
        # Every existing ancestor must let the unprivileged server account through.
        for parent in path.parents:
            if parent.exists():
                assert parent.stat().st_mode & 0o001, parent
    else:
        assert default_data_dir() == tmp_path / "xdg" / "leaseq" / "pg"
        monkeypatch.delenv("XDG_DATA_HOME")
        assert default_data_dir() == pathlib.Path.home() / ".local" / "share" / "leaseq" / "pg"


@needs_pg
def test_the_testing_kits_server_ignores_the_development_port(
    shared: EmbeddedServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 30: LEASEQ_EMBEDDED_PORT names the development server's port (here: busy, as
    when that server runs); the kit's own test server keeps its port instead of failing."""
    from leaseq.testing.plugin import test_server

    shared.ensure_running()
    port = shared.status().port
    shared.stop()
    busy = free_port()
    occupant = _listen_on(busy)
    monkeypatch.setenv("LEASEQ_EMBEDDED_PORT", str(busy))
    try:
        with pytest.raises(EmbeddedError, match="in use"):
            EmbeddedServer(shared.data_dir).ensure_running()  # the development server's way
        dsn = test_server(shared.data_dir).ensure_running()
    finally:
        occupant.close()
    assert shared.status().port == port and dsn.endswith(f":{port}/leaseq")
    assert _query(dsn, "SELECT 1") == 1
