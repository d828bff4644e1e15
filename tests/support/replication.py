"""A PostgreSQL primary and a streaming standby on loopback ports, for failover tests.

``ReplicaPair`` owns two throw-away clusters made from the machine's server binaries (found
and run the way the embedded server does it, as an unprivileged account when we are root):
the primary (``wal_level=replica``, a replication role, trust on 127.0.0.1 only) and a
standby cloned from it (see below). The standby streams WAL through a
:class:`~tests.support.faults.FaultProxy`, so a test can cut replication for real
(:meth:`cut`): pausing replay is not enough, since WAL would still arrive and a promotion
would replay it. Then it stops the primary (``pg_ctl stop -m immediate``: a crash), promotes
the standby, and everything committed on the primary after the cut is gone, as after an
asynchronous failover. :meth:`synchronous` makes the primary wait for the standby's flush at
each commit instead.

Both servers are copies of one template cluster (initdb, the database and the replication
role, then a clean shutdown), made once per test process: a copy of a cleanly stopped
cluster is a valid base for a standby (it replays from the same shutdown checkpoint), so a
pair costs two directory copies and two starts instead of initdb, CREATE DATABASE and
``pg_basebackup``. The standby still streams from the primary through the proxy.

Nothing here touches the shared embedded test server; each pair lives in a scratch
directory of its own (``tests.support.scratch``: RAM-backed when there is room), removed
by :meth:`close` (the template's at the process's exit).
"""

from __future__ import annotations

import atexit
import contextlib
import pathlib
import shutil
import subprocess
import time
from types import TracebackType

import psycopg

from leaseq.dev._pgproc import (
    SUPERUSER,
    ServerUser,
    conf_quote,
    find_bindir,
    give_to,
    last_line,
    run,
    server_user,
)
from leaseq.errors import EmbeddedError
from tests.support.faults import FaultProxy
from tests.support.ports import free_port
from tests.support.scratch import make_scratch

HOST = "127.0.0.1"
DATABASE = "leaseq"
REPLICATOR = "replicator"
STANDBY_NAME = "standby"
_TIMEOUT = 60.0

#: Settings of both servers: small, fast, loopback only, no Unix socket.
_SETTINGS = {
    "listen_addresses": conf_quote(HOST),
    "unix_socket_directories": "''",
    "wal_level": "replica",
    "max_wal_senders": "4",
    "wal_keep_size": conf_quote("64MB"),
    "hot_standby": "on",
    "max_connections": "60",
    "shared_buffers": conf_quote("16MB"),
    "fsync": "off",  # the machine does not crash in these tests; the postmaster does
    "lc_messages": conf_quote("C"),
    "wal_receiver_status_interval": conf_quote("1s"),
    "wal_retrieve_retry_interval": conf_quote("200ms"),
}


class ReplicaPair:
    """A primary, a standby streaming from it through a proxy, and the faults between them."""

    def __init__(self) -> None:
        self._bindir = find_bindir()
        self.base = make_scratch("leaseq-ha-")
        self.primary_dir = self.base / "primary"
        self.standby_dir = self.base / "standby"
        self._user: ServerUser | None = server_user(self.primary_dir)
        give_to(self.base, self._user)
        self.primary_port = free_port()
        self.standby_port = free_port()
        self.proxy = FaultProxy(HOST, self.primary_port)
        self._running: set[pathlib.Path] = set()

    # -- life cycle ---------------------------------------------------------------------

    def start(self) -> ReplicaPair:
        """Make both servers and start streaming; returns self once the standby is up."""
        template = _template(self._bindir, self._user)
        for data_dir in (self.primary_dir, self.standby_dir):
            self._check(
                run(["cp", "-a", str(template), str(data_dir)], self._user, timeout=_TIMEOUT),
                f"copy of the template cluster to {data_dir.name}",
            )
        _write_settings(self.primary_dir, self.primary_port, self._user)
        self._pg_ctl_start(self.primary_dir)
        self.proxy.start()
        # What ``pg_basebackup -R`` would write: stream from the primary through the proxy.
        conninfo = f"host={HOST} port={self.proxy.port} user={REPLICATOR}"
        _write_settings(
            self.standby_dir,
            self.standby_port,
            self._user,
            primary_conninfo=conf_quote(conninfo),
            cluster_name=conf_quote(STANDBY_NAME),
        )
        (self.standby_dir / "standby.signal").touch()
        give_to(self.standby_dir / "standby.signal", self._user)
        self._pg_ctl_start(self.standby_dir)
        self.wait_caught_up()
        return self

    def close(self) -> None:
        """Stop whatever still runs (immediately) and remove both clusters."""
        try:
            for data_dir in list(self._running):
                with contextlib.suppress(AssertionError, EmbeddedError):
                    self._stop(data_dir, "immediate")
            self.proxy.stop()
        finally:
            shutil.rmtree(self.base, ignore_errors=True)

    def __enter__(self) -> ReplicaPair:
        try:
            return self.start()
        except BaseException:
            self.close()  # half a pair started is still stopped and removed
            raise

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- addresses ----------------------------------------------------------------------

    @staticmethod
    def dsn(port: int, dbname: str = DATABASE) -> str:
        return f"host={HOST} port={port} dbname={dbname} user={SUPERUSER}"

    @property
    def primary_dsn(self) -> str:
        return self.dsn(self.primary_port)

    @property
    def standby_dsn(self) -> str:
        return self.dsn(self.standby_port)

    def multi_host_dsn(self, *, attrs: str | None = "read-write") -> str:
        """Both servers in one libpq DSN, the primary first; libpq picks the writable one."""
        dsn = (
            f"host={HOST},{HOST} port={self.primary_port},{self.standby_port} "
            f"dbname={DATABASE} user={SUPERUSER} connect_timeout=3"
        )
        return dsn + (f" target_session_attrs={attrs}" if attrs else "")

    # -- faults -------------------------------------------------------------------------

    def wait_caught_up(self, timeout: float = _TIMEOUT) -> None:
        """Until the standby has replayed everything the primary has written so far."""
        with psycopg.connect(self.primary_dsn, autocommit=True) as conn:
            row = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
        assert row is not None
        target = row[0]
        deadline = time.monotonic() + timeout
        with psycopg.connect(self.standby_dsn, autocommit=True) as conn:
            while True:
                caught = conn.execute(
                    "SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (target,)
                ).fetchone()
                if caught is not None and caught[0]:
                    return
                if time.monotonic() > deadline:
                    raise AssertionError(f"standby did not reach {target} in {timeout:.0f}s")
                time.sleep(0.05)

    def cut(self) -> None:
        """Cut replication: the standby's WAL stream is reset and cannot reconnect."""
        self.proxy.refuse(True)
        self.proxy.drop_all()
        # The primary notices its walsender's client gone; wait until it has, so a commit
        # after this call cannot still reach the standby.
        deadline = time.monotonic() + _TIMEOUT
        with psycopg.connect(self.primary_dsn, autocommit=True) as conn:
            while conn.execute("SELECT count(*) FROM pg_stat_replication").fetchone() != (0,):
                if time.monotonic() > deadline:
                    raise AssertionError("the primary still streams to the standby")
                time.sleep(0.05)

    def heal(self) -> None:
        """Let the standby stream again."""
        self.proxy.refuse(False)

    def synchronous(self, on: bool = True) -> None:
        """Make every commit on the primary wait for the standby's flush (or stop that)."""
        value = STANDBY_NAME if on else ""
        with psycopg.connect(self.primary_dsn, autocommit=True) as conn:
            conn.execute(f"ALTER SYSTEM SET synchronous_standby_names = '{value}'")
            conn.execute("SELECT pg_reload_conf()")

    def read_only_primary(self) -> None:
        """What a managed switchover does to the old primary before it goes: sessions stay
        connected, but every new transaction is read-only (SQLSTATE 25006 on a write)."""
        with psycopg.connect(self.primary_dsn, autocommit=True) as conn:
            conn.execute("ALTER SYSTEM SET default_transaction_read_only = on")
            conn.execute("SELECT pg_reload_conf()")

    def crash_primary(self) -> None:
        """``pg_ctl stop -m immediate``: the primary is gone without a checkpoint."""
        self._stop(self.primary_dir, "immediate")

    def stop_primary(self) -> None:
        """A fast shutdown: sessions are ended with SQLSTATE 57P01 (admin_shutdown)."""
        self._stop(self.primary_dir, "fast")

    def stop_standby(self) -> None:
        self._stop(self.standby_dir, "immediate")

    def promote(self) -> None:
        """The standby becomes a primary (with what it had received; nothing after a cut)."""
        self._check(
            run(
                [str(self._bindir / "pg_ctl"), "promote", "-w", "-D", str(self.standby_dir)],
                self._user,
                timeout=_TIMEOUT,
            ),
            "pg_ctl promote",
        )

    # -- helpers ------------------------------------------------------------------------

    def _pg_ctl_start(self, data_dir: pathlib.Path) -> None:
        self._running.add(data_dir)  # before: a start that times out may still come up
        _pg_ctl_start(self._bindir, self._user, data_dir, self.base / f"{data_dir.name}.log")

    def _stop(self, data_dir: pathlib.Path, mode: str) -> None:
        self._running.discard(data_dir)
        self._check(
            run(
                [str(self._bindir / "pg_ctl"), "stop", "-w", "-m", mode, "-D", str(data_dir)],
                self._user,
                timeout=_TIMEOUT,
            ),
            f"pg_ctl stop -m {mode}",
        )

    @staticmethod
    def _check(result: subprocess.CompletedProcess[str], what: str) -> None:
        _check(result, what)


def _check(result: subprocess.CompletedProcess[str], what: str) -> None:
    if result.returncode != 0:
        reason = last_line(result.stderr) or last_line(result.stdout) or "no output"
        raise AssertionError(f"{what} failed: {reason}")


def _write_settings(
    data_dir: pathlib.Path, port: int, user: ServerUser | None, **more: str
) -> None:
    settings = {**_SETTINGS, "port": str(port), **more}
    (data_dir / "postgresql.auto.conf").write_text(
        "".join(f"{name} = {value}\n" for name, value in settings.items())
    )
    give_to(data_dir / "postgresql.auto.conf", user)


def _pg_ctl_start(
    bindir: pathlib.Path, user: ServerUser | None, data_dir: pathlib.Path, log: pathlib.Path
) -> None:
    _check(
        run(
            [
                str(bindir / "pg_ctl"),
                "start",
                "-w",
                "-t",
                str(int(_TIMEOUT)),
                "-D",
                str(data_dir),
                "-l",
                str(log),
            ],
            user,
            timeout=_TIMEOUT + 10,
        ),
        f"pg_ctl start ({data_dir.name}; see {log})",
    )


#: The template cluster of this process, by server account (made on first use).
_templates: dict[int | None, pathlib.Path] = {}


def _template(bindir: pathlib.Path, user: ServerUser | None) -> pathlib.Path:
    """A cleanly stopped cluster with the database and the replication role, made once per
    process and removed at its exit; pairs copy it."""
    key = None if user is None else user.uid
    if key in _templates:
        return _templates[key]
    base = make_scratch("leaseq-ha-template-")
    atexit.register(shutil.rmtree, base, ignore_errors=True)
    give_to(base, user)
    data_dir = base / "data"
    data_dir.mkdir(mode=0o700)
    give_to(data_dir, user)
    _check(
        run(
            [
                str(bindir / "initdb"),
                "-D",
                str(data_dir),
                "-U",
                SUPERUSER,
                "--auth=trust",  # initdb's pg_hba also lets 127.0.0.1 replicate
                "--encoding=UTF8",
                "--locale=C",
                "--no-instructions",
                "--no-sync",
            ],
            user,
            timeout=_TIMEOUT,
        ),
        "initdb",
    )
    port = free_port()
    _write_settings(data_dir, port, user)
    _pg_ctl_start(bindir, user, data_dir, base / "template.log")
    try:
        dsn = ReplicaPair.dsn(port, "postgres")
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {DATABASE}")
            conn.execute(f"CREATE ROLE {REPLICATOR} REPLICATION LOGIN")
    finally:
        # A clean shutdown: its checkpoint is where both copies start from.
        stop = [str(bindir / "pg_ctl"), "stop", "-w", "-m", "fast", "-D", str(data_dir)]
        _check(run(stop, user, timeout=_TIMEOUT), "pg_ctl stop -m fast (template)")
    _templates[key] = data_dir
    return data_dir


def server_port(conn: psycopg.Connection[tuple[object, ...]]) -> int:
    """The port of the server a connection reached (which of the pair it is)."""
    row = conn.execute("SELECT inet_server_port()").fetchone()
    assert row is not None
    return int(str(row[0]))


__all__ = ["ReplicaPair", "server_port"]
