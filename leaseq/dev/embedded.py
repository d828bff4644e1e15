"""A private PostgreSQL cluster for development and tests, started on demand.

When no DSN is configured, leaseq runs its own cluster from the server binaries installed on the
machine, in a data directory nobody else uses, and reuses it across processes. It is a development
convenience, not a deployment: authentication is ``trust``, so it listens only on 127.0.0.1 and on
a Unix socket in a directory only the server's OS user can enter.

initdb and the server refuse to run as root, so when leaseq itself runs as root the cluster belongs
to an unprivileged account (``postgres`` if it exists, else ``nobody``) and every binary is run as
that account; this is why the default location for root is outside /root.

This module owns the life cycle of a cluster (initialise, configure, start, wait, stop, status);
the platform helpers it uses (pidfile, /proc, ports, binaries, accounts, socket directory, lock)
live in ``leaseq.dev._pgproc``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pathlib
import time
from dataclasses import dataclass

import psycopg

from leaseq.dev._pgproc import (
    DATABASE,
    HOST,
    SUPERUSER,
    Postmaster,
    ServerUser,
    bindir_version,
    check_port_number,
    check_root_layout,
    conf_quote,
    default_data_dir,
    dsn_for,
    file_size,
    find_bindir,
    free_port,
    give_to,
    has_server_binaries,
    last_fatal,
    last_line,
    lock_file_pid,
    locked,
    port_in_use,
    port_in_use_error,
    postmaster_state,
    private_socket_dir,
    read_from,
    read_pidfile,
    run,
    server_user,
    write_file,
)
from leaseq.errors import EmbeddedError

__all__ = [
    "DEFAULT_PORT",
    "EmbeddedServer",
    "EmbeddedStatus",
    "default_data_dir",
    "embedded_dsn",
    "find_bindir",
]

log = logging.getLogger(__name__)

#: Port a new cluster gets when it is free; far from 5432 so a system PostgreSQL never collides.
DEFAULT_PORT = 54329

_START_TIMEOUT = 30.0
_INITDB_TIMEOUT = 120.0

_STATE_FILE = "leaseq-embedded.json"
_CONF_FILE = "leaseq.conf"
_INCLUDE_LINE = f"include_if_exists = '{_CONF_FILE}'"
_LOG_FILE = "server.log"


@dataclass(frozen=True)
class EmbeddedStatus:
    """What ``leaseq embedded status`` shows; ``port``/``pid``/``dsn`` are None when unknown."""

    running: bool
    data_dir: pathlib.Path
    port: int | None
    pid: int | None
    dsn: str | None
    bindir: pathlib.Path | None
    version: str | None


def embedded_dsn() -> str:
    """DSN of the shared development cluster, starting it first if needed."""
    return EmbeddedServer(default_data_dir()).ensure_running()


class EmbeddedServer:
    """One cluster in one data directory; any number of processes may drive the same one.

    Every state change happens under an exclusive lock on ``<data_dir>.lock`` so that processes
    racing to start (or stop) the same cluster serialize instead of fighting over postmaster.pid.
    """

    def __init__(
        self,
        data_dir: str | os.PathLike[str] | None = None,
        *,
        port: int | None = None,
        port_from_env: bool = True,
    ) -> None:
        """``port_from_env=False``: ignore ``LEASEQ_EMBEDDED_PORT`` (it names the development
        server's port; the testing kit's own server must not move onto it)."""
        raw = default_data_dir() if data_dir is None else pathlib.Path(data_dir)
        self.data_dir: pathlib.Path = raw.expanduser().resolve()
        if port is not None:
            check_port_number(port, "port")
        self._port = port
        self._port_from_env = port_from_env

    def __repr__(self) -> str:
        return f"EmbeddedServer({str(self.data_dir)!r})"

    @property
    def log_file(self) -> pathlib.Path:
        return self.data_dir / _LOG_FILE

    @property
    def _lock_file(self) -> pathlib.Path:
        return self.data_dir.with_name(self.data_dir.name + ".lock")

    # -- public API ---------------------------------------------------------------------------

    def ensure_running(self) -> str:
        """Initialise the cluster if needed, start it if it is not running, return its DSN.

        A server that is already running is reused on whatever port it listens on; an explicit
        port only takes effect when this call is the one that starts it.
        """
        self._prepare_parent()
        with locked(self._lock_file):
            deadline = time.monotonic() + _START_TIMEOUT
            postmaster = self._live_postmaster(clear_stale=True)
            if postmaster is not None:
                # None if it exited while we waited (it was shutting down): start it below.
                postmaster = self._wait_ready(postmaster, deadline)
            if postmaster is None:
                port = self._choose_port()
                bindir = self._bindir()
                user = server_user(self.data_dir)
                if not self._initialized():
                    self._initdb(bindir, user)
                self._start(bindir, user, port, deadline)
                self._write_state(port, user)
                started = self._live_postmaster(clear_stale=False)
                postmaster = self._wait_ready(started, deadline) if started else None
                if postmaster is None:
                    raise EmbeddedError(self._start_failure_message(0))
            self._ensure_database(postmaster.port)
            return dsn_for(postmaster.port)

    def status(self) -> EmbeddedStatus:
        """Snapshot of the cluster; never starts or repairs anything, so it takes no lock."""
        postmaster = self._live_postmaster(clear_stale=False)
        try:
            bindir: pathlib.Path | None = self._bindir()
        except EmbeddedError:
            bindir = None
        version = self._cluster_version()
        if version is None and bindir is not None:
            with contextlib.suppress(EmbeddedError):
                version = bindir_version(bindir)
        if postmaster is None:
            return EmbeddedStatus(
                running=False,
                data_dir=self.data_dir,
                port=self._requested_port() or self._recorded_port(),
                pid=None,
                dsn=None,
                bindir=bindir,
                version=version,
            )
        # Port 0: the postmaster is so early in its startup that it has not written the port yet.
        return EmbeddedStatus(
            running=True,
            data_dir=self.data_dir,
            port=postmaster.port or None,
            pid=postmaster.pid,
            dsn=dsn_for(postmaster.port) if postmaster.port else None,
            bindir=bindir,
            version=version,
        )

    def stop(self) -> bool:
        """Fast shutdown (sessions are disconnected, nothing is lost); False if it was not up."""
        if not self.data_dir.exists():
            return False
        with locked(self._lock_file):
            postmaster = self._live_postmaster(clear_stale=True)
            if postmaster is None:
                return False
            bindir = self._bindir()
            result = run(
                [
                    str(bindir / "pg_ctl"),
                    "stop",
                    "-D",
                    str(self.data_dir),
                    "-m",
                    "fast",
                    "-w",
                    "-t",
                    str(int(_START_TIMEOUT)),
                    "-s",
                ],
                server_user(self.data_dir),
                timeout=_START_TIMEOUT + 10,
            )
            if result.returncode != 0:
                raise EmbeddedError(
                    f"could not stop embedded PostgreSQL (pid {postmaster.pid}): "
                    f"{last_line(result.stderr) or 'pg_ctl failed'}; see {self.log_file}"
                )
            log.info("stopped embedded PostgreSQL in %s", self.data_dir)
            return True

    @property
    def dsn(self) -> str:
        postmaster = self._live_postmaster(clear_stale=False)
        if postmaster is None or not postmaster.port:
            raise EmbeddedError(
                f"embedded PostgreSQL in {self.data_dir} is not running; start it first"
            )
        return dsn_for(postmaster.port)

    # -- paths, ownership, locking ------------------------------------------------------------

    def _prepare_parent(self) -> None:
        parent = self.data_dir.parent
        missing: list[pathlib.Path] = []
        for path in (parent, *parent.parents):
            if path.exists():
                break
            missing.append(path)
        for path in reversed(missing):
            with contextlib.suppress(FileExistsError):
                path.mkdir()
                if os.geteuid() == 0:
                    # Whatever root's umask, the server account must be able to pass through.
                    path.chmod(0o755)
        user = server_user(self.data_dir)
        if user is not None:
            check_root_layout(self.data_dir, user)

    # -- cluster state --------------------------------------------------------------------------

    def _initialized(self) -> bool:
        return (self.data_dir / "PG_VERSION").is_file()

    def _cluster_version(self) -> str | None:
        try:
            return (self.data_dir / "PG_VERSION").read_text().strip() or None
        except OSError:
            return None

    def _live_postmaster(self, *, clear_stale: bool) -> Postmaster | None:
        """The running postmaster, if any.

        A postmaster that did not shut down cleanly (SIGKILL, power loss, container killed)
        leaves postmaster.pid behind. PostgreSQL copes when that PID no longer exists, but
        refuses to start while kill(pid, 0) succeeds, which happens when the dead postmaster is
        a zombie (PID 1 in many containers never reaps orphans) or when the PID was reused after
        a reboot. In those cases we know the file is stale, so under the lock we remove it.
        """
        postmaster = read_pidfile(self.data_dir)
        if postmaster is None:
            return None
        state = postmaster_state(postmaster.pid, self.data_dir)
        if state == "alive":
            return postmaster
        if state == "stale" and clear_stale:
            log.info("removing lock files left by dead postmaster %d", postmaster.pid)
            # The socket's lock file names the same PID and would block the start just the same.
            if postmaster.socket_dir is not None:
                for lock in postmaster.socket_dir.glob(".s.PGSQL.*.lock"):
                    if lock_file_pid(lock) == postmaster.pid:
                        lock.unlink(missing_ok=True)
            (self.data_dir / "postmaster.pid").unlink(missing_ok=True)
        return None

    def _recorded_port(self) -> int | None:
        try:
            state = json.loads((self.data_dir / _STATE_FILE).read_text())
        except (OSError, ValueError):
            return None
        port = state.get("port") if isinstance(state, dict) else None
        return port if isinstance(port, int) and 0 < port < 65536 else None

    def _write_state(self, port: int, user: ServerUser | None) -> None:
        write_file(self.data_dir / _STATE_FILE, json.dumps({"port": port}) + "\n", user)

    # -- ports ------------------------------------------------------------------------------------

    def _requested_port(self) -> int | None:
        if self._port is not None:
            return self._port
        env = os.environ.get("LEASEQ_EMBEDDED_PORT") if self._port_from_env else None
        if not env:
            return None
        try:
            port = int(env)
        except ValueError:
            raise EmbeddedError(
                f"LEASEQ_EMBEDDED_PORT must be a port number (1-65535), got {env!r}"
            ) from None
        check_port_number(port, "LEASEQ_EMBEDDED_PORT")
        return port

    def _choose_port(self) -> int:
        """Port for the next start, already checked to be free.

        A cluster keeps the port it first got so DSNs handed out earlier stay valid, unless
        something else took it meanwhile (say, another leaseq cluster, for tests): then it
        moves to a free port, since nobody asked for that one. An explicit port (argument,
        then LEASEQ_EMBEDDED_PORT) wins, becomes the recorded one, and is never moved.
        """
        requested = self._requested_port()
        if requested is not None:
            if port_in_use(requested):
                raise port_in_use_error(requested)
            return requested
        port = self._recorded_port()
        if port is None:
            return DEFAULT_PORT if not port_in_use(DEFAULT_PORT) else free_port()
        if port_in_use(port):
            moved = free_port()
            log.warning("embedded PostgreSQL: port %d is taken; moving to %d", port, moved)
            return moved
        return port

    # -- running the binaries ---------------------------------------------------------------------

    def _bindir(self) -> pathlib.Path:
        """Binaries matching the cluster's major version when the machine has several."""
        bindir = find_bindir()
        wanted = self._cluster_version()
        if wanted is None or os.environ.get("LEASEQ_PG_BINDIR"):
            return bindir
        if bindir_version(bindir) == wanted:
            return bindir
        debian = pathlib.Path("/usr/lib/postgresql") / wanted / "bin"
        if has_server_binaries(debian):
            return debian
        raise EmbeddedError(
            f"{self.data_dir} was created by PostgreSQL {wanted} but {bindir} holds "
            f"PostgreSQL {bindir_version(bindir)}; set LEASEQ_PG_BINDIR to a "
            f"PostgreSQL {wanted} bin directory"
        )

    def _initdb(self, bindir: pathlib.Path, user: ServerUser | None) -> None:
        if self.data_dir.exists():
            if any(self.data_dir.iterdir()):
                raise EmbeddedError(
                    f"{self.data_dir} exists but is not a PostgreSQL data directory; remove it "
                    "or choose another data directory (LEASEQ_EMBEDDED_DIR)"
                )
        else:
            self.data_dir.mkdir(mode=0o700)
        # initdb runs as the server account and cannot create the directory in a root-owned
        # parent itself, so it gets an empty one it owns.
        give_to(self.data_dir, user)
        log.info("initialising embedded PostgreSQL cluster in %s", self.data_dir)
        result = run(
            [
                str(bindir / "initdb"),
                "-D",
                str(self.data_dir),
                "-U",
                SUPERUSER,
                "--auth=trust",
                "--encoding=UTF8",
                # The C locale exists everywhere, so initdb cannot fail on the caller's LANG.
                "--locale=C",
                "--no-instructions",
            ],
            user,
            timeout=_INITDB_TIMEOUT,
            log_file=self.log_file,
        )
        if result.returncode != 0:
            raise EmbeddedError(
                f"initdb failed for {self.data_dir}: "
                f"{last_line(result.stderr) or last_line(result.stdout) or 'no output'}"
            )

    def _configure(self, port: int, user: ServerUser | None) -> None:
        """Rewrite leaseq.conf; postgresql.conf only includes it.

        Our settings live in their own file, rewritten at every start, so the socket path follows
        the data directory if it moves and a newer leaseq can change them. Settings a user makes
        with ALTER SYSTEM still win, because postgresql.auto.conf is read last.
        """
        main_conf = self.data_dir / "postgresql.conf"
        text = main_conf.read_text()
        if _INCLUDE_LINE not in text.splitlines():
            with main_conf.open("a") as f:
                f.write(f"\n# Settings of the leaseq embedded server\n{_INCLUDE_LINE}\n")
        socket_dir = private_socket_dir(self.data_dir, user)
        settings = {
            "listen_addresses": conf_quote(HOST),
            "port": str(port),
            # Double quotes inside the value keep a path with spaces or commas one entry.
            "unix_socket_directories": conf_quote('"' + str(socket_dir).replace('"', '""') + '"'),
            "max_connections": "200",
            "shared_buffers": conf_quote("128MB"),
            "lc_messages": conf_quote("C"),
        }
        body = "".join(f"{name} = {value}\n" for name, value in settings.items())
        write_file(
            self.data_dir / _CONF_FILE,
            "# Written by leaseq at every start; edits are lost. Use ALTER SYSTEM instead.\n"
            + body,
            user,
        )

    def _start(
        self, bindir: pathlib.Path, user: ServerUser | None, port: int, deadline: float
    ) -> None:
        self._configure(port, user)
        log.info("starting embedded PostgreSQL in %s on port %d", self.data_dir, port)
        while True:
            log_offset = file_size(self.log_file)
            remaining = max(1, int(deadline - time.monotonic()))
            result = run(
                [
                    str(bindir / "pg_ctl"),
                    "start",
                    "-D",
                    str(self.data_dir),
                    "-l",
                    str(self.log_file),
                    "-w",
                    "-t",
                    str(remaining),
                    "-s",
                ],
                user,
                timeout=remaining + 10,
            )
            if result.returncode == 0:
                return
            new_log = read_from(self.log_file, log_offset)
            if "could not bind" in new_log or "Address already in use" in new_log:
                raise port_in_use_error(port)
            if "pre-existing shared memory block" in new_log and time.monotonic() < deadline:
                # Children of a killed postmaster are still exiting; they will be gone shortly.
                time.sleep(0.2)
                continue
            raise EmbeddedError(self._start_failure_message(log_offset, result.stderr))

    def _start_failure_message(self, log_offset: int, stderr: str = "") -> str:
        reason = last_fatal(read_from(self.log_file, log_offset)) or last_line(stderr)
        detail = f" ({reason})" if reason else ""
        return f"embedded PostgreSQL failed to start{detail}; see {self.log_file}"

    def _wait_ready(self, postmaster: Postmaster, deadline: float) -> Postmaster | None:
        """The postmaster once it accepts connections; None if it exits meanwhile.

        Waiting covers a server that another tool is starting, or one in crash recovery.
        """
        while True:
            # The port line appears in postmaster.pid only part-way through startup.
            current = read_pidfile(self.data_dir)
            if current is not None and current.pid == postmaster.pid and current.port:
                postmaster = current
            if postmaster.port:
                try:
                    with psycopg.connect(dsn_for(postmaster.port, "postgres"), connect_timeout=2):
                        return postmaster
                except psycopg.OperationalError:
                    pass
            if postmaster_state(postmaster.pid, self.data_dir) != "alive":
                return None
            if time.monotonic() > deadline:
                raise EmbeddedError(self._start_failure_message(0))
            time.sleep(0.1)

    def _ensure_database(self, port: int) -> None:
        try:
            with psycopg.connect(
                dsn_for(port, "postgres"), autocommit=True, connect_timeout=10
            ) as conn:
                row = conn.execute(
                    "SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE,)
                ).fetchone()
                if row is None:
                    log.info("creating database %s in embedded PostgreSQL", DATABASE)
                    with contextlib.suppress(psycopg.errors.DuplicateDatabase):
                        conn.execute(f"CREATE DATABASE {DATABASE}")
        except psycopg.Error as exc:
            raise EmbeddedError(
                f"cannot create database {DATABASE!r} in embedded PostgreSQL on port {port}: "
                f"{last_line(str(exc))}; see {self.log_file}"
            ) from exc
