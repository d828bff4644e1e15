"""A loopback TCP proxy that breaks connections on purpose.

``FaultProxy`` sits between a client (a leaseq worker, a psycopg connection) and a
target server (PostgreSQL) and forwards bytes both ways from one background thread
driven by a ``selectors`` loop. The test thread injects faults while traffic flows:

``stall()`` / ``resume()``
    A network partition that looks like a hang. While stalled the proxy reads nothing
    and writes nothing on any connection, current or new; every socket stays open.
    New clients are still accepted (the kernel would complete their handshake anyway),
    but the proxy does not dial the target for them until ``resume()``. Nothing is
    dropped: bytes sent during the stall wait in kernel socket buffers (plus at most
    the proxy's own per-direction buffer) and are delivered in order after
    ``resume()``, the way TCP retransmission delivers them once a partition heals. A
    query sent during the stall therefore completes after ``resume()``, unless the
    client gave up (closed) in the meantime.

``drop_all()``
    Abortive close (RST via ``SO_LINGER`` 0) of both sides of every current
    connection, including half-open ones. New connections are accepted as usual.

``refuse(on)``
    While on, new clients are accepted and reset at once (the server is "down");
    existing connections are untouched. Refused clients are counted in ``refused``,
    not in ``accepted``.

``half_open()``
    For every current connection: reset the server side (so the server sees its
    client gone) and stop reading from and writing to the client side while keeping
    the client socket open (so the client sees a hang). Half-open connections stay
    that way across ``resume()``; they still count in ``connections`` until
    ``drop_all()`` or ``stop()`` closes their client socket.

Fault calls are thread-safe: each runs on the proxy thread and returns once applied,
so the effect is in place (for all bytes not already handed to the kernel) when the
call returns. The proxy listens on 127.0.0.1 only and logs nothing. An unexpected
error inside the proxy thread is kept and raised again by ``stop()``.
"""

from __future__ import annotations

import contextlib
import errno
import queue
import selectors
import socket
import struct
import threading
from collections.abc import Callable
from concurrent.futures import Future
from types import TracebackType
from typing import Final, Literal, TypeVar, cast

from psycopg.conninfo import conninfo_to_dict, make_conninfo

__all__ = ["FaultProxy"]

_T = TypeVar("_T")

_LISTEN_HOST: Final = "127.0.0.1"
_BUFFER: Final = 256 * 1024  # per direction, per connection
_RECV: Final = 64 * 1024
_ACCEPTS_PER_WAKE: Final = 64
_CALL_TIMEOUT: Final = 10.0
_JOIN_TIMEOUT: Final = 10.0
_LINGER_RST: Final = struct.pack("ii", 1, 0)

_Side = Literal["client", "server"]
_State = Literal["pending", "connecting", "open", "half_open", "closed"]
_AddrInfo = tuple[socket.AddressFamily, socket.SocketKind, int, str, tuple[object, ...]]


def _close(sock: socket.socket, *, reset: bool) -> None:
    if reset:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RST)
    with contextlib.suppress(OSError):
        sock.close()


class _Conn:
    """One proxied connection: the accepted client socket and the dialled server socket."""

    def __init__(self, client: socket.socket) -> None:
        self.client = client
        self.server: socket.socket | None = None
        self.state: _State = "pending"
        self.addrs: list[_AddrInfo] = []
        self.c2s = bytearray()  # read from the client, not yet written to the server
        self.s2c = bytearray()  # read from the server, not yet written to the client
        self.client_eof = False  # the client shut down its sending side
        self.server_eof = False
        self.c2s_shut = False  # we propagated client_eof to the server (SHUT_WR)
        self.s2c_shut = False
        self.masks: dict[_Side, int] = {"client": 0, "server": 0}


class FaultProxy:
    """Forward 127.0.0.1:``port`` to ``(target_host, target_port)``, with injectable faults."""

    def __init__(
        self,
        target_host: str,
        target_port: int,
        *,
        listen_port: int = 0,
        listen_host: str = _LISTEN_HOST,
    ) -> None:
        """``listen_host`` other than loopback is only for the address of a test host the
        test itself made (a veth end towards a network namespace of its own)."""
        self._listen_host = listen_host
        self._target = (target_host, target_port)
        self._listen_port = listen_port
        self._api_lock = threading.Lock()  # serialises start/stop against each other
        self._queue_lock = threading.Lock()  # guards _loop_closed against command puts
        self._commands: queue.SimpleQueue[tuple[Callable[[], object], Future[object]]] = (
            queue.SimpleQueue()
        )
        self._thread: threading.Thread | None = None
        self._started = False
        self._stopped = False
        self._loop_closed = False
        self._stopping = False
        self._error: BaseException | None = None
        self._port: int | None = None
        self._addrs: list[_AddrInfo] = []
        self._sel: selectors.BaseSelector | None = None
        self._listener: socket.socket | None = None
        self._wake_r: socket.socket | None = None
        self._wake_w: socket.socket | None = None
        self._conns: set[_Conn] = set()
        self._stalled = False
        self._refusing = False
        self._accepted = 0
        self._refused = 0

    # -- lifecycle -------------------------------------------------------------------

    def start(self) -> None:
        """Bind 127.0.0.1:``listen_port`` (0: any free port) and start forwarding."""
        with self._api_lock:
            if self._started or self._stopped:
                raise RuntimeError("a FaultProxy can be started only once")
            infos = socket.getaddrinfo(*self._target, type=socket.SOCK_STREAM)
            if not infos:
                raise OSError(f"cannot resolve {self._target[0]!r}")
            self._addrs = [(f, t, p, c, tuple(a)) for f, t, p, c, a in infos]
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                listener.bind((self._listen_host, self._listen_port))
                listener.listen(128)
                listener.setblocking(False)
            except BaseException:
                listener.close()
                raise
            self._listener = listener
            self._port = int(listener.getsockname()[1])
            self._wake_r, self._wake_w = socket.socketpair()
            self._wake_r.setblocking(False)
            self._wake_w.setblocking(False)
            sel = selectors.DefaultSelector()
            sel.register(listener, selectors.EVENT_READ, "listen")
            sel.register(self._wake_r, selectors.EVENT_READ, "wake")
            self._sel = sel
            self._thread = threading.Thread(
                target=self._run, name=f"FaultProxy:{self._port}", daemon=True
            )
            with self._queue_lock:
                self._started = True
                self._thread.start()

    def stop(self) -> None:
        """Reset every connection, close the listener and join the thread. Idempotent."""
        with self._api_lock:
            if not self._started or self._stopped:
                return
            self._stopped = True
            thread = self._thread
            assert thread is not None
            with self._queue_lock:
                self._stopping = True
                self._wake()
            thread.join(_JOIN_TIMEOUT)
            if thread.is_alive():
                raise RuntimeError("FaultProxy thread did not stop")
            if self._error is not None:
                raise RuntimeError("FaultProxy thread failed") from self._error

    def __enter__(self) -> FaultProxy:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- information -----------------------------------------------------------------

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("FaultProxy is not started")
        return self._port

    def dsn(self, dsn: str) -> str:
        """``dsn`` (URI or key=value) pointed at this proxy instead of its own host/port."""
        params = conninfo_to_dict(dsn)
        params.pop("hostaddr", None)
        params["host"] = self._listen_host
        params["port"] = str(self.port)
        return make_conninfo("", **params)

    @property
    def connections(self) -> int:
        """Proxied connections whose client socket is still open (half-open ones included)."""
        return len(self._conns)

    @property
    def accepted(self) -> int:
        """Clients accepted for forwarding since start (refused ones not included)."""
        return self._accepted

    @property
    def refused(self) -> int:
        """Clients accepted and reset at once because ``refuse()`` was on."""
        return self._refused

    @property
    def stalled(self) -> bool:
        return self._stalled

    # -- faults ----------------------------------------------------------------------

    def stall(self) -> None:
        """Stop moving bytes on all connections, current and new; keep every socket open."""
        self._call(self._do_stall)

    def resume(self) -> None:
        """Forward again. Bytes held back by the stall are delivered in order, not dropped."""
        self._call(self._do_resume)

    def drop_all(self) -> int:
        """Reset both sides of every current connection; return how many there were."""
        return self._call(self._do_drop_all)

    def refuse(self, on: bool = True) -> None:
        """While on, reset each new client as soon as it is accepted."""

        def apply() -> None:
            self._refusing = on

        self._call(apply)

    def half_open(self) -> int:
        """Reset the server side of each connection, leave its client hanging.

        Returns how many connections were turned half-open (ones already half-open are
        not counted again)."""
        return self._call(self._do_half_open)

    # -- command plumbing ------------------------------------------------------------

    def _call(self, fn: Callable[[], _T]) -> _T:
        """Run ``fn`` on the proxy thread (or inline when it is not running) and return."""
        if threading.current_thread() is self._thread:
            return fn()
        future: Future[object] = Future()
        with self._queue_lock:
            if not self._started:
                return fn()  # no thread yet: nothing races with us
            if self._loop_closed or self._stopping:
                raise RuntimeError("FaultProxy is stopped")
            self._commands.put((fn, future))
            self._wake()
        return cast(_T, future.result(_CALL_TIMEOUT))

    def _wake(self) -> None:
        assert self._wake_w is not None
        with contextlib.suppress(BlockingIOError, InterruptedError):
            self._wake_w.send(b"\0")

    def _run_commands(self) -> None:
        assert self._wake_r is not None
        with contextlib.suppress(BlockingIOError, InterruptedError):
            while self._wake_r.recv(4096):
                pass
        while True:
            try:
                fn, future = self._commands.get_nowait()
            except queue.Empty:
                return
            try:
                result = fn()
            except Exception as exc:
                future.set_exception(exc)
            else:
                future.set_result(result)

    # -- the loop --------------------------------------------------------------------

    def _run(self) -> None:
        sel = self._sel
        assert sel is not None
        try:
            while not self._stopping:
                for key, events in sel.select():
                    tag = key.data
                    if tag == "wake":
                        self._run_commands()
                    elif tag == "listen":
                        self._accept()
                    else:
                        conn, side = tag
                        # Skip events made stale earlier in this batch (by a fault
                        # command or an abort), and anything but dialling while stalled.
                        if conn.state == "connecting" or (
                            conn.state == "open" and not self._stalled
                        ):
                            self._on_event(conn, side, events)
        except BaseException as exc:
            self._error = exc
        finally:
            self._shutdown()

    def _shutdown(self) -> None:
        with self._queue_lock:
            self._loop_closed = True
        while True:
            try:
                _, future = self._commands.get_nowait()
            except queue.Empty:
                break
            future.set_exception(RuntimeError("FaultProxy is stopped"))
        for conn in list(self._conns):
            self._abort(conn)
        assert self._sel is not None
        self._sel.close()
        for sock in (self._listener, self._wake_r, self._wake_w):
            if sock is not None:
                _close(sock, reset=False)

    def _accept(self) -> None:
        assert self._listener is not None
        for _ in range(_ACCEPTS_PER_WAKE):
            try:
                client, _addr = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in (errno.ECONNABORTED, errno.EPROTO):
                    continue
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    return  # out of resources: leave the backlog for later
                raise
            if self._refusing:
                self._refused += 1
                _close(client, reset=True)
                continue
            client.setblocking(False)
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._accepted += 1
            conn = _Conn(client)
            self._conns.add(conn)
            if not self._stalled:
                conn.addrs = list(self._addrs)
                self._dial(conn)
            self._update(conn)

    def _dial(self, conn: _Conn) -> None:
        """Start a non-blocking connect to the next target address, or abort if none left."""
        while conn.addrs:
            family, kind, proto, _canon, addr = conn.addrs.pop(0)
            server = socket.socket(family, kind, proto)
            server.setblocking(False)
            with contextlib.suppress(OSError):
                server.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            rc = server.connect_ex(addr)
            if rc in (0, errno.EINPROGRESS, errno.EAGAIN, errno.EWOULDBLOCK):
                conn.server = server
                conn.state = "open" if rc == 0 else "connecting"
                return
            _close(server, reset=False)
        self._abort(conn)

    def _on_event(self, conn: _Conn, side: _Side, events: int) -> None:
        try:
            if side == "server" and conn.state == "connecting":
                assert conn.server is not None
                err = conn.server.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if err:
                    self._unregister(conn, "server")
                    _close(conn.server, reset=False)
                    conn.server = None
                    self._dial(conn)
                else:
                    conn.state = "open"
            elif conn.state == "connecting":
                # Client bytes arriving before the target answered: buffer them.
                if side == "client" and events & selectors.EVENT_READ and not self._stalled:
                    self._read(conn, "client")
            elif events & selectors.EVENT_READ:
                self._read(conn, side)
            if conn.state == "open" and not self._stalled:
                self._flush(conn, "client")
                self._flush(conn, "server")
                self._propagate_eof(conn)
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:
            # Reset, broken pipe, refused...: mirror it as an abortive close of both sides.
            self._abort(conn)
            return
        if conn.state != "closed":
            self._update(conn)

    def _read(self, conn: _Conn, side: _Side) -> None:
        sock = conn.client if side == "client" else conn.server
        buf = conn.c2s if side == "client" else conn.s2c
        assert sock is not None
        room = _BUFFER - len(buf)
        if room <= 0:
            return
        try:
            data = sock.recv(min(room, _RECV))
        except (BlockingIOError, InterruptedError):
            return
        if data:
            buf += data
        elif side == "client":
            conn.client_eof = True
        else:
            conn.server_eof = True

    def _flush(self, conn: _Conn, to: _Side) -> None:
        """Write what is buffered for ``to``, as far as its socket takes it."""
        if self._stalled or conn.state != "open":
            return
        sock = conn.client if to == "client" else conn.server
        buf = conn.s2c if to == "client" else conn.c2s
        assert sock is not None
        while buf:
            try:
                sent = sock.send(buf)
            except (BlockingIOError, InterruptedError):
                return
            del buf[:sent]

    def _propagate_eof(self, conn: _Conn) -> None:
        assert conn.server is not None
        if conn.client_eof and not conn.c2s and not conn.c2s_shut:
            conn.c2s_shut = True
            conn.server.shutdown(socket.SHUT_WR)
        if conn.server_eof and not conn.s2c and not conn.s2c_shut:
            conn.s2c_shut = True
            conn.client.shutdown(socket.SHUT_WR)
        if conn.c2s_shut and conn.s2c_shut:
            self._close_conn(conn, reset=False)

    # -- selector interest -----------------------------------------------------------

    def _update(self, conn: _Conn) -> None:
        client_mask = 0
        server_mask = 0
        if conn.state == "connecting":
            server_mask = selectors.EVENT_WRITE
        active = conn.state in ("connecting", "open") and not self._stalled
        if active and not conn.client_eof and len(conn.c2s) < _BUFFER:
            client_mask |= selectors.EVENT_READ
        if conn.state == "open" and not self._stalled:
            if conn.s2c:
                client_mask |= selectors.EVENT_WRITE
            if not conn.server_eof and len(conn.s2c) < _BUFFER:
                server_mask |= selectors.EVENT_READ
            if conn.c2s:
                server_mask |= selectors.EVENT_WRITE
        self._set_mask(conn, "client", client_mask)
        self._set_mask(conn, "server", server_mask)

    def _set_mask(self, conn: _Conn, side: _Side, mask: int) -> None:
        old = conn.masks[side]
        if mask == old:
            return
        sel = self._sel
        sock = conn.client if side == "client" else conn.server
        assert sel is not None and sock is not None
        if old == 0:
            sel.register(sock, mask, (conn, side))
        elif mask == 0:
            sel.unregister(sock)
        else:
            sel.modify(sock, mask, (conn, side))
        conn.masks[side] = mask

    def _unregister(self, conn: _Conn, side: _Side) -> None:
        if conn.masks[side]:
            self._set_mask(conn, side, 0)

    def _close_conn(self, conn: _Conn, *, reset: bool) -> None:
        if conn.state == "closed":
            return
        self._unregister(conn, "client")
        _close(conn.client, reset=reset)
        if conn.server is not None:
            self._unregister(conn, "server")
            _close(conn.server, reset=reset)
            conn.server = None
        conn.state = "closed"
        conn.c2s.clear()
        conn.s2c.clear()
        self._conns.discard(conn)

    def _abort(self, conn: _Conn) -> None:
        self._close_conn(conn, reset=True)

    # -- fault implementations (run on the proxy thread) -----------------------------

    def _do_stall(self) -> None:
        self._stalled = True
        for conn in self._conns:
            self._update(conn)

    def _do_resume(self) -> None:
        self._stalled = False
        for conn in list(self._conns):
            if conn.state == "pending":
                conn.addrs = list(self._addrs)
                self._dial(conn)
            if conn.state != "closed":
                self._update(conn)

    def _do_drop_all(self) -> int:
        conns = list(self._conns)
        for conn in conns:
            self._abort(conn)
        return len(conns)

    def _do_half_open(self) -> int:
        conns = [c for c in self._conns if c.state != "half_open"]
        for conn in conns:
            self._unregister(conn, "client")
            if conn.server is not None:
                self._unregister(conn, "server")
                _close(conn.server, reset=True)
                conn.server = None
            conn.state = "half_open"
            conn.c2s.clear()
            conn.s2c.clear()
        return len(conns)
