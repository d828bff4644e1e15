"""Platform helpers of the embedded server: paths and accounts, the postmaster's pidfile and
/proc, ports, the server binaries and running them, the socket directory, the lock file.

Nothing here knows the life cycle of a cluster; ``leaseq.dev.embedded`` drives that.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
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

from leaseq.errors import EmbeddedError

HOST = "127.0.0.1"
SUPERUSER = "leaseq"
DATABASE = "leaseq"
ROOT_DEFAULT_DIR = pathlib.Path("/var/tmp/leaseq-embedded/pg")

# The lock holder may be running initdb and then waiting the full start timeout.
_LOCK_TIMEOUT = 120.0

_SOCKET_SUBDIR = "socket"
# sun_path is 104 bytes on macOS and 108 on Linux; PostgreSQL appends "/.s.PGSQL.<port>".
_MAX_SOCKET_DIR_LEN = 103 - len("/.s.PGSQL.65535")

_BINDIR_NOT_FOUND = (
    "PostgreSQL server binaries (initdb, pg_ctl) not found; install them "
    "(Debian: apt-get install postgresql) or set LEASEQ_PG_BINDIR"
)


@dataclass(frozen=True)
class Postmaster:
    pid: int
    port: int
    socket_dir: pathlib.Path | None = None


@dataclass(frozen=True)
class ServerUser:
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
        return ROOT_DEFAULT_DIR
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
        if has_server_binaries(path):
            return path.absolute()
        raise EmbeddedError(
            f"PostgreSQL server binaries (initdb, pg_ctl) not found in {path} "
            "(from LEASEQ_PG_BINDIR); point it at a directory containing them, or unset it"
        )
    for candidate in _bindir_candidates():
        if has_server_binaries(candidate):
            return candidate
    raise EmbeddedError(_BINDIR_NOT_FOUND)


def check_root_layout(data_dir: pathlib.Path, user: ServerUser) -> None:
    parent = data_dir.parent
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
                f"{data_dir} is not reachable by the server account {user.name} "
                f"({path} is closed to it); use a directory outside {path}, e.g. "
                f"LEASEQ_EMBEDDED_DIR={ROOT_DEFAULT_DIR}"
            )


@contextlib.contextmanager
def locked(lock_file: pathlib.Path) -> Iterator[None]:
    flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(lock_file, flags, 0o644)
    except OSError as exc:
        raise EmbeddedError(f"cannot open lock file {lock_file}: {exc.strerror}") from exc
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
                        f"holding {lock_file}"
                    ) from None
                time.sleep(0.05)
        yield
    finally:
        os.close(fd)  # closing releases the flock


def server_user(data_dir: pathlib.Path) -> ServerUser | None:
    """Account the binaries run as when leaseq runs as root; None means "as ourselves".

    An existing cluster keeps the account that owns it, so a cluster created as ``nobody``
    still works after a ``postgres`` account appears.
    """
    if os.geteuid() != 0:
        return None
    with contextlib.suppress(OSError):
        if (data_dir / "PG_VERSION").exists():
            owner = data_dir.stat().st_uid
            if owner != 0:
                with contextlib.suppress(KeyError):
                    entry = pwd.getpwuid(owner)
                    return ServerUser(entry.pw_name, entry.pw_uid, entry.pw_gid)
    for name in ("postgres", "nobody"):
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            continue
        return ServerUser(entry.pw_name, entry.pw_uid, entry.pw_gid)
    raise EmbeddedError(
        "running as root but neither a 'postgres' nor a 'nobody' account exists to run "
        "PostgreSQL (it refuses root); create one or run leaseq as a normal user"
    )


def give_to(path: pathlib.Path, user: ServerUser | None) -> None:
    if user is not None:
        os.chown(path, user.uid, user.gid)


def read_pidfile(data_dir: pathlib.Path) -> Postmaster | None:
    try:
        lines = (data_dir / "postmaster.pid").read_text().splitlines()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise EmbeddedError(f"cannot read {data_dir / 'postmaster.pid'}: {exc.strerror}") from exc
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
    return Postmaster(pid, port, socket_dir)


def write_file(path: pathlib.Path, text: str, user: ServerUser | None) -> None:
    # Atomic so a concurrent status() or a crashing start never sees half a file.
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    give_to(tmp, user)
    tmp.replace(path)


def bindir_version(bindir: pathlib.Path) -> str:
    result = run([str(bindir / "pg_ctl"), "--version"], None, timeout=30)
    match = re.search(r"\(PostgreSQL\) (\d+)(?:\.(\d+))?", result.stdout)
    if result.returncode != 0 or match is None:
        raise EmbeddedError(f"cannot tell the PostgreSQL version of {bindir / 'pg_ctl'}")
    major, minor = match.groups()
    # Before PostgreSQL 10 the major version had two parts (9.6).
    return major if int(major) >= 10 or minor is None else f"{major}.{minor}"


def run(
    args: Sequence[str],
    user: ServerUser | None,
    *,
    timeout: float,
    log_file: pathlib.Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run a server binary (as ``user`` when given), with English messages and no PG* env."""
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
            f"{pathlib.Path(args[0]).name} did not finish within {timeout:.0f}s"
            + (f"; see {log_file}" if log_file is not None else "")
        ) from None
    except OSError as exc:
        raise EmbeddedError(f"cannot run {args[0]}: {exc.strerror}") from exc


def private_socket_dir(data_dir: pathlib.Path, user: ServerUser | None) -> pathlib.Path:
    """Directory for the Unix socket, which trust authentication makes private by need.

    Inside the (mode 700) data directory only the server's account can reach the socket. A
    deep data directory would exceed the socket path limit, and then a private directory
    under the temp dir is used instead, named after the data directory so restarts reuse it.
    """
    inside = data_dir / _SOCKET_SUBDIR
    if len(os.fsencode(inside)) <= _MAX_SOCKET_DIR_LEN:
        inside.mkdir(mode=0o700, exist_ok=True)
        give_to(inside, user)
        return inside
    owner = user.uid if user is not None else os.geteuid()
    tag = hashlib.sha256(os.fsencode(data_dir)).hexdigest()[:16]
    fallback = pathlib.Path(tempfile.gettempdir()) / f"leaseq-pg-{owner}-{tag}"
    with contextlib.suppress(FileExistsError):
        fallback.mkdir(mode=0o700)
        give_to(fallback, user)
    st = fallback.lstat()
    # The temp dir is world-writable: only trust a directory that is really ours.
    if stat.S_ISDIR(st.st_mode) and st.st_uid == owner and st.st_mode & 0o077 == 0:
        return fallback
    fresh = pathlib.Path(tempfile.mkdtemp(prefix=f"leaseq-pg-{tag}-"))
    give_to(fresh, user)
    return fresh


def dsn_for(port: int, dbname: str = DATABASE) -> str:
    return f"postgresql://{SUPERUSER}@{HOST}:{port}/{dbname}"


def check_port_number(port: int, what: str) -> None:
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise EmbeddedError(f"{what} must be a port number (1-65535), got {port!r}")


def port_in_use_error(port: int) -> EmbeddedError:
    return EmbeddedError(
        f"port {port} on {HOST} is in use by another process; pass port=... / set "
        "LEASEQ_EMBEDDED_PORT or stop that process"
    )


def port_in_use(port: int) -> bool:
    """Whether PostgreSQL would fail to listen on the port.

    SO_REUSEADDR mirrors what the postmaster does, so sockets in TIME_WAIT left by our own
    previous run do not count as "in use" while a real listener does.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((HOST, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return True
            raise EmbeddedError(f"cannot use port {port} on {HOST}: {exc.strerror}") from exc
    return False


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
        return port


def postmaster_state(pid: int, data_dir: pathlib.Path) -> str:
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


def lock_file_pid(path: pathlib.Path) -> int | None:
    try:
        with path.open() as f:
            return int(f.readline())
    except (OSError, ValueError):
        return None


def _can_search(st: os.stat_result, user: ServerUser) -> bool:
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


def has_server_binaries(path: pathlib.Path) -> bool:
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


def conf_quote(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "''") + "'"


def file_size(path: pathlib.Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def read_from(path: pathlib.Path, offset: int) -> str:
    # The log is never rotated, so only its tail is worth reading.
    try:
        with path.open("rb") as f:
            f.seek(max(offset, f.seek(0, os.SEEK_END) - 65536))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def last_fatal(text: str) -> str:
    """The last FATAL/PANIC/ERROR message, which says why the server did not come up."""
    for line in reversed(text.splitlines()):
        for marker in ("FATAL:", "PANIC:", "ERROR:"):
            if marker in line:
                return line.split(marker, 1)[1].strip()
    return ""


def last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""
