"""A private PostgreSQL cluster for development and tests, started on demand.

When no DSN is configured, leaseq runs its own cluster from the server binaries installed on the
machine, in a data directory nobody else uses, and reuses it across processes. It is a development
convenience, not a deployment: authentication is ``trust``, so it listens only on 127.0.0.1 and on
a Unix socket in a directory only the server's OS user can enter.

initdb and the server refuse to run as root, so when leaseq itself runs as root the cluster belongs
to an unprivileged account (``postgres`` if it exists, else ``nobody``) and every binary is run as
that account; this is why the default location for root is outside /root.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import logging
import os
import pathlib
import pwd
import re
import shutil
import socket
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import psycopg

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

_HOST = "127.0.0.1"
_SUPERUSER = "leaseq"
_DATABASE = "leaseq"
_ROOT_DEFAULT_DIR = pathlib.Path("/var/tmp/leaseq-embedded/pg")

_START_TIMEOUT = 30.0
# The lock holder may be running initdb and then waiting the full start timeout.
_LOCK_TIMEOUT = 120.0
_INITDB_TIMEOUT = 120.0

_STATE_FILE = "leaseq-embedded.json"
_CONF_FILE = "leaseq.conf"
_INCLUDE_LINE = f"include_if_exists = '{_CONF_FILE}'"
_LOG_FILE = "server.log"
_SOCKET_SUBDIR = "socket"
# sun_path is 104 bytes on macOS and 108 on Linux; PostgreSQL appends "/.s.PGSQL.<port>".
_MAX_SOCKET_DIR_LEN = 103 - len("/.s.PGSQL.65535")

_BINDIR_NOT_FOUND = (
    "PostgreSQL server binaries (initdb, pg_ctl) not found; install them "
    "(Debian: apt-get install postgresql) or set LEASEQ_PG_BINDIR"
)


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


@dataclass(frozen=True)
class _Postmaster:
    pid: int
    port: int
    socket_dir: pathlib.Path | None = None


@dataclass(frozen=True)
class _ServerUser:
    name: str
    uid: int
    gid: int


def default_data_dir() -> pathlib.Path:
    """Where the shared development cluster lives unless LEASEQ_EMBEDDED_DIR says otherwise.

    Root gets a path under /var/tmp because the unprivileged server account must be able to reach
    it (/root is mode 700) and /var/tmp, unlike /tmp, survives reboots.
    """
    configured = os.environ.get("LEASEQ_EMBEDDED_DIR")
    if configured:
        return pathlib.Path(configured).expanduser().absolute()
    if os.geteuid() == 0:
        return _ROOT_DEFAULT_DIR
    xdg = os.environ.get("XDG_DATA_HOME")
    # The XDG spec says relative values are invalid and must be ignored.
    base = (
        pathlib.Path(xdg)
        if xdg and os.path.isabs(xdg)
        else pathlib.Path.home() / ".local" / "share"
    )
    return base / "leaseq" / "pg"


def find_bindir() -> pathlib.Path:
    """Directory holding initdb and pg_ctl.

    An explicit LEASEQ_PG_BINDIR is never second-guessed: falling back to other binaries would
    hide a typo and might start a different major version than the user asked for.
    """
    configured = os.environ.get("LEASEQ_PG_BINDIR")
    if configured:
        path = pathlib.Path(configured).expanduser()
        if _has_server_binaries(path):
            return path.absolute()
        raise EmbeddedError(
            f"PostgreSQL server binaries (initdb, pg_ctl) not found in {path} "
            "(from LEASEQ_PG_BINDIR); point it at a directory containing them, or unset it"
        )
    for candidate in _bindir_candidates():
        if _has_server_binaries(candidate):
            return candidate
    raise EmbeddedError(_BINDIR_NOT_FOUND)


def embedded_dsn() -> str:
    """DSN of the shared development cluster, starting it first if needed."""
    return EmbeddedServer(default_data_dir()).ensure_running()


class EmbeddedServer:
    """One cluster in one data directory; any number of processes may drive the same one.

    Every state change happens under an exclusive lock on ``<data_dir>.lock`` so that processes
    racing to start (or stop) the same cluster serialize instead of fighting over postmaster.pid.
    """

    def __init__(
        self, data_dir: str | os.PathLike[str] | None = None, *, port: int | None = None
    ) -> None:
        raw = default_data_dir() if data_dir is None else pathlib.Path(data_dir)
        self.data_dir: pathlib.Path = raw.expanduser().resolve()
        if port is not None:
            _check_port_number(port, "port")
        self._port = port

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
        with self._locked():
            deadline = time.monotonic() + _START_TIMEOUT
            postmaster = self._live_postmaster(clear_stale=True)
            if postmaster is not None:
                # None if it exited while we waited (it was shutting down): start it below.
                postmaster = self._wait_ready(postmaster, deadline)
            if postmaster is None:
                port = self._choose_port()
                bindir = self._bindir()
                user = self._server_user()
                if not self._initialized():
                    self._initdb(bindir, user)
                self._start(bindir, user, port, deadline)
                self._write_state(port, user)
                started = self._live_postmaster(clear_stale=False)
                postmaster = self._wait_ready(started, deadline) if started else None
                if postmaster is None:
                    raise EmbeddedError(self._start_failure_message(0))
            self._ensure_database(postmaster.port)
            return _dsn(postmaster.port)

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
                version = self._bindir_version(bindir)
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
            dsn=_dsn(postmaster.port) if postmaster.port else None,
            bindir=bindir,
            version=version,
        )

    def stop(self) -> bool:
        """Fast shutdown (sessions are disconnected, nothing is lost); False if it was not up."""
        if not self.data_dir.exists():
            return False
        with self._locked():
            postmaster = self._live_postmaster(clear_stale=True)
            if postmaster is None:
                return False
            bindir = self._bindir()
            result = self._run(
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
                self._server_user(),
                timeout=_START_TIMEOUT + 10,
            )
            if result.returncode != 0:
                raise EmbeddedError(
                    f"could not stop embedded PostgreSQL (pid {postmaster.pid}): "
                    f"{_last_line(result.stderr) or 'pg_ctl failed'}; see {self.log_file}"
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
        return _dsn(postmaster.port)

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
        user = self._server_user()
        if user is not None:
            self._check_root_layout(user)

    def _check_root_layout(self, user: _ServerUser) -> None:
        parent = self.data_dir.parent
        owner = parent.stat().st_uid
        if owner not in (0, user.uid):
            # Root would otherwise create the lock file and chown the data directory inside a
            # directory another account controls (e.g. one squatted under /var/tmp).
            owner_name = _user_name(owner)
            raise EmbeddedError(
                f"refusing to run embedded PostgreSQL as root under {parent}, which belongs to "
                f"{owner_name}; remove it or set LEASEQ_EMBEDDED_DIR to a root-owned location"
            )
        for path in (parent, *parent.parents):
            if not _can_search(path.stat(), user):
                raise EmbeddedError(
                    f"{self.data_dir} is not reachable by the server account {user.name} "
                    f"({path} is closed to it); use a directory outside {path}, e.g. "
                    f"LEASEQ_EMBEDDED_DIR={_ROOT_DEFAULT_DIR}"
                )

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0)
        try:
            fd = os.open(self._lock_file, flags, 0o644)
        except OSError as exc:
            raise EmbeddedError(f"cannot open lock file {self._lock_file}: {exc.strerror}") from exc
        try:
            deadline = time.monotonic() + _LOCK_TIMEOUT
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise EmbeddedError(
                            f"timed out after {_LOCK_TIMEOUT:.0f}s waiting for another process "
                            f"holding {self._lock_file}"
                        ) from None
                    time.sleep(0.05)
            yield
        finally:
            os.close(fd)  # closing releases the flock

    def _server_user(self) -> _ServerUser | None:
        """Account the binaries run as when leaseq runs as root; None means "as ourselves".

        An existing cluster keeps the account that owns it, so a cluster created as ``nobody``
        still works after a ``postgres`` account appears.
        """
        if os.geteuid() != 0:
            return None
        with contextlib.suppress(OSError):
            if (self.data_dir / "PG_VERSION").exists():
                owner = self.data_dir.stat().st_uid
                if owner != 0:
                    with contextlib.suppress(KeyError):
                        entry = pwd.getpwuid(owner)
                        return _ServerUser(entry.pw_name, entry.pw_uid, entry.pw_gid)
        for name in ("postgres", "nobody"):
            try:
                entry = pwd.getpwnam(name)
            except KeyError:
                continue
            return _ServerUser(entry.pw_name, entry.pw_uid, entry.pw_gid)
        raise EmbeddedError(
            "running as root but neither a 'postgres' nor a 'nobody' account exists to run "
            "PostgreSQL (it refuses root); create one or run leaseq as a normal user"
        )

    def _give_to_server(self, path: pathlib.Path, user: _ServerUser | None) -> None:
        if user is not None:
            os.chown(path, user.uid, user.gid)

    # -- cluster state --------------------------------------------------------------------------

    def _initialized(self) -> bool:
        return (self.data_dir / "PG_VERSION").is_file()

    def _cluster_version(self) -> str | None:
        try:
            return (self.data_dir / "PG_VERSION").read_text().strip() or None
        except OSError:
            return None

    def _read_pidfile(self) -> _Postmaster | None:
        try:
            lines = (self.data_dir / "postmaster.pid").read_text().splitlines()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise EmbeddedError(
                f"cannot read {self.data_dir / 'postmaster.pid'}: {exc.strerror}"
            ) from exc
        # Line 1 is the PID, line 4 the port and line 5 the first socket directory; the
        # postmaster writes the file in stages, so a short file means it is still starting.
        try:
            pid = int(lines[0])
            port = int(lines[3]) if len(lines) > 3 else 0
        except (IndexError, ValueError):
            return None
        if pid <= 0:
            return None
        socket_dir = pathlib.Path(lines[4]) if len(lines) > 4 and lines[4] else None
        return _Postmaster(pid, port, socket_dir)

    def _live_postmaster(self, *, clear_stale: bool) -> _Postmaster | None:
        """The running postmaster, if any.

        A postmaster that did not shut down cleanly (SIGKILL, power loss, container killed)
        leaves postmaster.pid behind. PostgreSQL copes when that PID no longer exists, but
        refuses to start while kill(pid, 0) succeeds, which happens when the dead postmaster is
        a zombie (PID 1 in many containers never reaps orphans) or when the PID was reused after
        a reboot. In those cases we know the file is stale, so under the lock we remove it.
        """
        postmaster = self._read_pidfile()
        if postmaster is None:
            return None
        state = _postmaster_state(postmaster.pid, self.data_dir)
        if state == "alive":
            return postmaster
        if state == "stale" and clear_stale:
            log.info("removing lock files left by dead postmaster %d", postmaster.pid)
            # The socket's lock file names the same PID and would block the start just the same.
            if postmaster.socket_dir is not None:
                for lock in postmaster.socket_dir.glob(".s.PGSQL.*.lock"):
                    if _lock_file_pid(lock) == postmaster.pid:
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

    def _write_state(self, port: int, user: _ServerUser | None) -> None:
        self._write_file(self.data_dir / _STATE_FILE, json.dumps({"port": port}) + "\n", user)

    def _write_file(self, path: pathlib.Path, text: str, user: _ServerUser | None) -> None:
        # Atomic so a concurrent status() or a crashing start never sees half a file.
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text)
        self._give_to_server(tmp, user)
        tmp.replace(path)

    # -- ports ------------------------------------------------------------------------------------

    def _requested_port(self) -> int | None:
        if self._port is not None:
            return self._port
        env = os.environ.get("LEASEQ_EMBEDDED_PORT")
        if not env:
            return None
        try:
            port = int(env)
        except ValueError:
            raise EmbeddedError(
                f"LEASEQ_EMBEDDED_PORT must be a port number (1-65535), got {env!r}"
            ) from None
        _check_port_number(port, "LEASEQ_EMBEDDED_PORT")
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
            if _port_in_use(requested):
                raise _port_in_use_error(requested)
            return requested
        port = self._recorded_port()
        if port is None:
            return DEFAULT_PORT if not _port_in_use(DEFAULT_PORT) else _free_port()
        if _port_in_use(port):
            moved = _free_port()
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
        if self._bindir_version(bindir) == wanted:
            return bindir
        debian = pathlib.Path("/usr/lib/postgresql") / wanted / "bin"
        if _has_server_binaries(debian):
            return debian
        raise EmbeddedError(
            f"{self.data_dir} was created by PostgreSQL {wanted} but {bindir} holds "
            f"PostgreSQL {self._bindir_version(bindir)}; set LEASEQ_PG_BINDIR to a "
            f"PostgreSQL {wanted} bin directory"
        )

    def _bindir_version(self, bindir: pathlib.Path) -> str:
        result = self._run([str(bindir / "pg_ctl"), "--version"], None, timeout=30)
        match = re.search(r"\(PostgreSQL\) (\d+)(?:\.(\d+))?", result.stdout)
        if result.returncode != 0 or match is None:
            raise EmbeddedError(f"cannot tell the PostgreSQL version of {bindir / 'pg_ctl'}")
        major, minor = match.groups()
        # Before PostgreSQL 10 the major version had two parts (9.6).
        return major if int(major) >= 10 or minor is None else f"{major}.{minor}"

    def _run(
        self, args: Sequence[str], user: _ServerUser | None, *, timeout: float
    ) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        # English messages, so the log lines we look for are recognisable.
        env["LC_ALL"] = "C"
        try:
            if user is None:
                return subprocess.run(
                    args, capture_output=True, text=True, env=env, cwd="/", timeout=timeout
                )
            env["HOME"] = pwd.getpwuid(user.uid).pw_dir
            env["USER"] = env["LOGNAME"] = user.name
            return subprocess.run(
                args,
                capture_output=True,
                text=True,
                env=env,
                cwd="/",
                timeout=timeout,
                user=user.uid,
                group=user.gid,
                extra_groups=[],
            )
        except subprocess.TimeoutExpired:
            raise EmbeddedError(
                f"{pathlib.Path(args[0]).name} did not finish within {timeout:.0f}s; "
                f"see {self.log_file}"
            ) from None
        except OSError as exc:
            raise EmbeddedError(f"cannot run {args[0]}: {exc.strerror}") from exc

    def _initdb(self, bindir: pathlib.Path, user: _ServerUser | None) -> None:
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
        self._give_to_server(self.data_dir, user)
        log.info("initialising embedded PostgreSQL cluster in %s", self.data_dir)
        result = self._run(
            [
                str(bindir / "initdb"),
                "-D",
                str(self.data_dir),
                "-U",
                _SUPERUSER,
                "--auth=trust",
                "--encoding=UTF8",
                # The C locale exists everywhere, so initdb cannot fail on the caller's LANG.
                "--locale=C",
                "--no-instructions",
            ],
            user,
            timeout=_INITDB_TIMEOUT,
        )
        if result.returncode != 0:
            raise EmbeddedError(
                f"initdb failed for {self.data_dir}: "
                f"{_last_line(result.stderr) or _last_line(result.stdout) or 'no output'}"
            )

    def _configure(self, port: int, user: _ServerUser | None) -> None:
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
        socket_dir = self._socket_dir(user)
        settings = {
            "listen_addresses": _conf_quote(_HOST),
            "port": str(port),
            # Double quotes inside the value keep a path with spaces or commas one entry.
            "unix_socket_directories": _conf_quote('"' + str(socket_dir).replace('"', '""') + '"'),
            "max_connections": "200",
            "shared_buffers": _conf_quote("128MB"),
            "lc_messages": _conf_quote("C"),
        }
        body = "".join(f"{name} = {value}\n" for name, value in settings.items())
        self._write_file(
            self.data_dir / _CONF_FILE,
            "# Written by leaseq at every start; edits are lost. Use ALTER SYSTEM instead.\n"
            + body,
            user,
        )

    def _socket_dir(self, user: _ServerUser | None) -> pathlib.Path:
        """Directory for the Unix socket, which trust authentication makes private by need.

        Inside the (mode 700) data directory only the server's account can reach the socket. A
        deep data directory would exceed the socket path limit, and then a private directory
        under the temp dir is used instead, named after the data directory so restarts reuse it.
        """
        inside = self.data_dir / _SOCKET_SUBDIR
        if len(os.fsencode(inside)) <= _MAX_SOCKET_DIR_LEN:
            inside.mkdir(mode=0o700, exist_ok=True)
            self._give_to_server(inside, user)
            return inside
        owner = user.uid if user is not None else os.geteuid()
        tag = hashlib.sha256(os.fsencode(self.data_dir)).hexdigest()[:16]
        fallback = pathlib.Path(tempfile.gettempdir()) / f"leaseq-pg-{owner}-{tag}"
        with contextlib.suppress(FileExistsError):
            fallback.mkdir(mode=0o700)
            self._give_to_server(fallback, user)
        st = fallback.lstat()
        # The temp dir is world-writable: only trust a directory that is really ours.
        if stat.S_ISDIR(st.st_mode) and st.st_uid == owner and st.st_mode & 0o077 == 0:
            return fallback
        fresh = pathlib.Path(tempfile.mkdtemp(prefix=f"leaseq-pg-{tag}-"))
        self._give_to_server(fresh, user)
        return fresh

    def _start(
        self, bindir: pathlib.Path, user: _ServerUser | None, port: int, deadline: float
    ) -> None:
        self._configure(port, user)
        log.info("starting embedded PostgreSQL in %s on port %d", self.data_dir, port)
        while True:
            log_offset = _file_size(self.log_file)
            remaining = max(1, int(deadline - time.monotonic()))
            result = self._run(
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
            new_log = _read_from(self.log_file, log_offset)
            if "could not bind" in new_log or "Address already in use" in new_log:
                raise _port_in_use_error(port)
            if "pre-existing shared memory block" in new_log and time.monotonic() < deadline:
                # Children of a killed postmaster are still exiting; they will be gone shortly.
                time.sleep(0.2)
                continue
            raise EmbeddedError(self._start_failure_message(log_offset, result.stderr))

    def _start_failure_message(self, log_offset: int, stderr: str = "") -> str:
        reason = _last_fatal(_read_from(self.log_file, log_offset)) or _last_line(stderr)
        detail = f" ({reason})" if reason else ""
        return f"embedded PostgreSQL failed to start{detail}; see {self.log_file}"

    def _wait_ready(self, postmaster: _Postmaster, deadline: float) -> _Postmaster | None:
        """The postmaster once it accepts connections; None if it exits meanwhile.

        Waiting covers a server that another tool is starting, or one in crash recovery.
        """
        while True:
            # The port line appears in postmaster.pid only part-way through startup.
            current = self._read_pidfile()
            if current is not None and current.pid == postmaster.pid and current.port:
                postmaster = current
            if postmaster.port:
                try:
                    with psycopg.connect(_dsn(postmaster.port, "postgres"), connect_timeout=2):
                        return postmaster
                except psycopg.OperationalError:
                    pass
            if _postmaster_state(postmaster.pid, self.data_dir) != "alive":
                return None
            if time.monotonic() > deadline:
                raise EmbeddedError(self._start_failure_message(0))
            time.sleep(0.1)

    def _ensure_database(self, port: int) -> None:
        try:
            with psycopg.connect(
                _dsn(port, "postgres"), autocommit=True, connect_timeout=10
            ) as conn:
                row = conn.execute(
                    "SELECT 1 FROM pg_database WHERE datname = %s", (_DATABASE,)
                ).fetchone()
                if row is None:
                    log.info("creating database %s in embedded PostgreSQL", _DATABASE)
                    with contextlib.suppress(psycopg.errors.DuplicateDatabase):
                        conn.execute(f"CREATE DATABASE {_DATABASE}")
        except psycopg.Error as exc:
            raise EmbeddedError(
                f"cannot create database {_DATABASE!r} in embedded PostgreSQL on port {port}: "
                f"{_last_line(str(exc))}; see {self.log_file}"
            ) from exc


# -- helpers -----------------------------------------------------------------------------------


def _dsn(port: int, dbname: str = _DATABASE) -> str:
    return f"postgresql://{_SUPERUSER}@{_HOST}:{port}/{dbname}"


def _check_port_number(port: int, what: str) -> None:
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise EmbeddedError(f"{what} must be a port number (1-65535), got {port!r}")


def _port_in_use_error(port: int) -> EmbeddedError:
    return EmbeddedError(
        f"port {port} on {_HOST} is in use by another process; pass port=... / set "
        "LEASEQ_EMBEDDED_PORT or stop that process"
    )


def _port_in_use(port: int) -> bool:
    """Whether PostgreSQL would fail to listen on the port.

    SO_REUSEADDR mirrors what the postmaster does, so sockets in TIME_WAIT left by our own
    previous run do not count as "in use" while a real listener does.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((_HOST, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return True
            raise EmbeddedError(f"cannot use port {port} on {_HOST}: {exc.strerror}") from exc
    return False


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((_HOST, 0))
        port: int = sock.getsockname()[1]
        return port


def _postmaster_state(pid: int, data_dir: pathlib.Path) -> str:
    """'alive'; 'gone'; or 'stale': the PID exists but is certainly not this cluster's postmaster.

    Without procfs (macOS) a live PID has to be taken at its word, as pg_ctl does.
    """
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return "gone"
    except PermissionError:
        pass  # exists, owned by another account
    proc = pathlib.Path(f"/proc/{pid}")
    try:
        stat_line = (proc / "stat").read_text()
    except OSError:
        return "alive"
    # The command name in parentheses may itself contain spaces and parentheses.
    fields = stat_line.rpartition(")")[2].split()
    if fields and fields[0] in ("Z", "X"):
        return "stale"
    # The postmaster lives in its data directory (it chdirs there at startup), so a process
    # with another working directory merely inherited the PID. We can read the link for our
    # own processes and, as root, for the server account's; otherwise assume it is alive.
    try:
        cwd = pathlib.Path(os.readlink(proc / "cwd"))
    except OSError:
        return "alive"
    return "alive" if cwd == data_dir else "stale"


def _lock_file_pid(path: pathlib.Path) -> int | None:
    try:
        with path.open() as f:
            return int(f.readline())
    except (OSError, ValueError):
        return None


def _can_search(st: os.stat_result, user: _ServerUser) -> bool:
    # The server runs with no supplementary groups (extra_groups=[]), so only its primary
    # group counts.
    if st.st_uid == user.uid:
        return bool(st.st_mode & stat.S_IXUSR)
    if st.st_gid == user.gid:
        return bool(st.st_mode & stat.S_IXGRP)
    return bool(st.st_mode & stat.S_IXOTH)


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def _has_server_binaries(path: pathlib.Path) -> bool:
    return all(os.access(path / name, os.X_OK) for name in ("initdb", "pg_ctl")) and all(
        (path / name).is_file() for name in ("initdb", "pg_ctl")
    )


def _bindir_candidates() -> Iterator[pathlib.Path]:
    pg_config = shutil.which("pg_config")
    if pg_config:
        try:
            result = subprocess.run(
                [pg_config, "--bindir"], capture_output=True, text=True, timeout=10
            )
        except (OSError, subprocess.TimeoutExpired):
            pass
        else:
            if result.returncode == 0 and result.stdout.strip():
                yield pathlib.Path(result.stdout.strip())
    pg_ctl = shutil.which("pg_ctl")
    if pg_ctl:
        # Debian's /usr/bin entries are symlinks into a version-specific directory.
        yield pathlib.Path(pg_ctl).resolve().parent
    versions: list[tuple[tuple[int, ...], pathlib.Path]] = []
    for path in pathlib.Path("/usr/lib/postgresql").glob("*/bin"):
        try:
            key = tuple(int(part) for part in path.parent.name.split("."))
        except ValueError:
            continue
        versions.append((key, path))
    for _, path in sorted(versions, reverse=True):
        yield path


def _conf_quote(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "''") + "'"


def _file_size(path: pathlib.Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _read_from(path: pathlib.Path, offset: int) -> str:
    # The log is never rotated, so only its tail is worth reading.
    try:
        with path.open("rb") as f:
            f.seek(max(offset, f.seek(0, os.SEEK_END) - 65536))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def _last_fatal(text: str) -> str:
    """The last FATAL/PANIC/ERROR message, which says why the server did not come up."""
    for line in reversed(text.splitlines()):
        for marker in ("FATAL:", "PANIC:", "ERROR:"):
            if marker in line:
                return line.split(marker, 1)[1].strip()
    return ""


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""
