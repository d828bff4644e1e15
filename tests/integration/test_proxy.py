"""The fault-injecting TCP proxy, against the real PostgreSQL of the test session."""

from __future__ import annotations

import functools
import pathlib
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from tests.support.faults import FaultProxy
from tests.support.requires import missing

Conn = psycopg.Connection[tuple[Any, ...]]


@pytest.fixture()
def proxy(dsn: str) -> Iterator[FaultProxy]:
    params = conninfo_to_dict(dsn)
    host = str(params.get("host") or "127.0.0.1")
    port = int(params.get("port") or 5432)
    with FaultProxy(host, port) as p:
        yield p


def _connect(dsn: str, **kwargs: Any) -> Conn:
    kwargs.setdefault("connect_timeout", 5)
    return psycopg.connect(dsn, autocommit=True, **kwargs)


def _wait_until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.05)


class _Background:
    """Run ``fn`` in a daemon thread; keep its result or exception."""

    def __init__(self, fn: Callable[[], object]) -> None:
        self.result: object = None
        self.error: BaseException | None = None
        self._fn = fn
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.result = self._fn()
        except BaseException as exc:
            self.error = exc

    def done(self, wait: float = 0.0) -> bool:
        self.thread.join(wait)
        return not self.thread.is_alive()


def _backend_alive(dsn: str, app: str) -> bool:
    with _connect(dsn) as c:
        row = c.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (app,)
        ).fetchone()
    assert row is not None
    return bool(row[0])


def test_dsn_points_at_the_proxy(proxy: FaultProxy) -> None:
    for given in (
        "postgresql://u:pw@db.example:6543/app?sslmode=disable",
        "host=db.example hostaddr=10.0.0.1 port=6543 user=u dbname=app",
    ):
        parts = conninfo_to_dict(proxy.dsn(given))
        assert parts["host"] == "127.0.0.1"
        assert parts["port"] == str(proxy.port)
        assert "hostaddr" not in parts
        assert parts["user"] == "u"
        assert parts["dbname"] == "app"


def test_forwards_queries_both_ways_and_counts(dsn: str, proxy: FaultProxy) -> None:
    big = "x" * 3_000_000  # larger than every buffer on the path, both directions
    with _connect(proxy.dsn(dsn)) as c:
        row = c.execute("SELECT %s::text || 'y', inet_server_port()", (big,)).fetchone()
        assert row is not None
        assert row[0] == big + "y"
        assert proxy.connections == 1
    _wait_until(lambda: proxy.connections == 0)
    assert proxy.accepted == 1

    def work(i: int) -> int:
        with _connect(proxy.dsn(dsn)) as c:
            total = 0
            for _ in range(20):
                row = c.execute("SELECT %s::int + 1", (i,)).fetchone()
                assert row is not None
                total += row[0]
            return total

    workers = [_Background(functools.partial(work, i)) for i in range(12)]
    for w in workers:
        assert w.done(10)
        assert w.error is None
    assert sorted(int(str(w.result)) for w in workers) == [20 * (i + 1) for i in range(12)]
    assert proxy.accepted == 13
    _wait_until(lambda: proxy.connections == 0)


def test_stall_hangs_and_resume_delivers(dsn: str, proxy: FaultProxy) -> None:
    with _connect(proxy.dsn(dsn)) as c:
        assert c.execute("SELECT 1").fetchone() == (1,)
        proxy.stall()
        pending = _Background(lambda: c.execute("SELECT 42").fetchone())
        newcomer = _Background(lambda: _connect(proxy.dsn(dsn)).close())
        assert not pending.done(0.5)
        assert not newcomer.done(0.0)
        assert proxy.connections == 2  # the newcomer is accepted, just never answered
        proxy.resume()
        # Bytes sent during the stall are delivered, not dropped: both finish normally.
        assert pending.done(5)
        assert pending.error is None
        assert pending.result == (42,)
        assert newcomer.done(5)
        assert newcomer.error is None
        assert c.execute("SELECT 2").fetchone() == (2,)
    with _connect(proxy.dsn(dsn)) as fresh:
        assert fresh.execute("SELECT 3").fetchone() == (3,)


def test_drop_all_breaks_existing_connections_only(dsn: str, proxy: FaultProxy) -> None:
    a = _connect(proxy.dsn(dsn))
    b = _connect(proxy.dsn(dsn))
    try:
        assert proxy.drop_all() == 2
        assert proxy.connections == 0
        for c in (a, b):
            with pytest.raises(psycopg.OperationalError):
                c.execute("SELECT 1")
        with _connect(proxy.dsn(dsn)) as fresh:
            assert fresh.execute("SELECT 1").fetchone() == (1,)
        assert proxy.accepted == 3
    finally:
        a.close()
        b.close()


def test_refuse_fails_new_connections_fast(dsn: str, proxy: FaultProxy) -> None:
    with _connect(proxy.dsn(dsn)) as existing:
        proxy.refuse()
        started = time.monotonic()
        with pytest.raises(psycopg.OperationalError):
            _connect(proxy.dsn(dsn), connect_timeout=5)
        assert time.monotonic() - started < 1.0
        assert proxy.refused >= 1
        assert existing.execute("SELECT 1").fetchone() == (1,)  # untouched
        proxy.refuse(False)
        with _connect(proxy.dsn(dsn)) as fresh:
            assert fresh.execute("SELECT 1").fetchone() == (1,)
    assert proxy.accepted == 2


def test_half_open_drops_backend_while_client_hangs(dsn: str, proxy: FaultProxy) -> None:
    app = f"halfopen-{uuid.uuid4().hex[:8]}"
    c = _connect(proxy.dsn(dsn), application_name=app)
    try:
        assert c.execute("SELECT 1").fetchone() == (1,)
        assert _backend_alive(dsn, app)
        assert proxy.half_open() == 1
        _wait_until(lambda: not _backend_alive(dsn, app), timeout=5)
        hung = _Background(lambda: c.execute("SELECT 1").fetchone())
        assert not hung.done(0.5)
        assert proxy.connections == 1  # the client socket is still open
        proxy.resume()  # does not revive a half-open connection
        assert not hung.done(0.2)
        assert proxy.drop_all() == 1
        assert hung.done(5)
        assert isinstance(hung.error, psycopg.OperationalError)
    finally:
        c.close()


def test_stop_with_open_connections(dsn: str) -> None:
    params = conninfo_to_dict(dsn)
    p = FaultProxy(str(params.get("host") or "127.0.0.1"), int(params.get("port") or 5432))
    p.start()
    conns = [_connect(p.dsn(dsn)) for _ in range(5)]
    try:
        p.stall()  # even with traffic stuck
        hung = _Background(lambda: conns[0].execute("SELECT 1"))
        assert not hung.done(0.2)
        started = time.monotonic()
        p.stop()
        assert time.monotonic() - started < 2.0
        p.stop()  # idempotent
        assert hung.done(5)
        assert isinstance(hung.error, psycopg.OperationalError)
        for c in conns[1:]:
            with pytest.raises(psycopg.OperationalError):
                c.execute("SELECT 1")
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", p.port), timeout=1).close()
        with pytest.raises(RuntimeError):
            p.stall()
    finally:
        for c in conns:
            c.close()


def test_listens_on_loopback_only(proxy: FaultProxy) -> None:
    table = pathlib.Path("/proc/net/tcp")
    if not table.exists():
        missing("needs Linux /proc/net/tcp")
    listening = []
    for line in table.read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        addr, port = local.split(":")
        if state == "0A" and int(port, 16) == proxy.port:  # 0A = LISTEN
            listening.append(addr)
    assert listening == ["0100007F"]  # 127.0.0.1, little-endian hex
    v6 = pathlib.Path("/proc/net/tcp6")
    if v6.exists():
        for line in v6.read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            assert not (state == "0A" and int(local.split(":")[1], 16) == proxy.port)


def test_half_close_propagates_both_ways() -> None:
    """Client EOF reaches the server as EOF, the reply still flows back, then EOF again."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        payload = bytes(range(256)) * 4096  # 1 MiB

        def serve() -> int:
            peer, _ = server.accept()
            with peer:
                got = bytearray()
                while chunk := peer.recv(65536):
                    got += chunk
                peer.sendall(bytes(got[::-1]))
                return len(got)

        with FaultProxy("127.0.0.1", server.getsockname()[1]) as p:
            echo = _Background(serve)
            with socket.create_connection(("127.0.0.1", p.port), timeout=5) as c:
                c.sendall(payload)
                c.shutdown(socket.SHUT_WR)
                reply = bytearray()
                while chunk := c.recv(65536):
                    reply += chunk
            assert echo.done(5)
            assert echo.result == len(payload)
            assert bytes(reply) == payload[::-1]
            _wait_until(lambda: p.connections == 0)


def test_unreachable_target_resets_client() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead_port = s.getsockname()[1]  # bound but not listening: connections are refused
        with FaultProxy("127.0.0.1", dead_port) as p:
            # A reset, not a clean EOF and not a hang. It can win the race with the client's
            # own connect() and surface there already.
            with pytest.raises(ConnectionResetError):
                c = socket.create_connection(("127.0.0.1", p.port), timeout=5)
                with c:
                    c.recv(1)
            _wait_until(lambda: p.connections == 0)
