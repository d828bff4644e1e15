"""A real Patroni cluster on loopback ports, for failover tests: one etcd member and two (or
more) PostgreSQL nodes, each run by its own Patroni.

``PatroniCluster`` owns everything in a scratch directory of its own
(``tests.support.scratch``): etcd (``/usr/bin/etcd``, free client and peer ports, its own
data directory), and nodes ``node0``, ``node1`` (``nodes=3``: and ``node2``), each
a Patroni process (REST API on a free port) that bootstraps or clones a PostgreSQL data
directory with the machine's server binaries (found as ``leaseq.dev._pgproc`` finds them) and
runs it as the unprivileged server account when we are root. Failover settings are fast
(``ttl`` 10 s, ``loop_wait`` 1 s, ``retry_timeout`` 4 s); an old primary rejoins with
``pg_rewind``, or is cloned again when rewinding fails.

Operations: :meth:`switchover` (Patroni's REST API: the old primary stops cleanly, the
caught-up replica is promoted), :meth:`hard_failover` (``kill -9`` of the primary's
Patroni, its postmaster and every backend, as if the node died: the leader key expires and
the replica is promoted; then that node's Patroni is started again and rejoins as a
replica), :meth:`set_synchronous` (Patroni's ``synchronous_mode``; ``strict=True`` adds
``synchronous_mode_strict``: with no synchronous standby the primary takes no writes at all,
rather than falling back to asynchronous replication), :meth:`multi_host_dsn`.

:meth:`close` (also on a failed start) kills every process whose working directory is inside
the cluster's directory (Patroni, postmasters and their backends, etcd; found with psutil),
then removes the directory. Nothing here touches the shared embedded test server.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from types import TracebackType
from typing import Any

import psutil
import psycopg

from leaseq.dev._pgproc import (
    SUPERUSER,
    ServerUser,
    find_bindir,
    give_to,
    read_pidfile,
    server_user,
)
from tests.support.ports import free_port
from tests.support.scratch import make_scratch

HOST = "127.0.0.1"
DATABASE = "leaseq"
REPLICATOR = "replicator"
NODES = ("node0", "node1")  # the default two-node cluster's
_START_TIMEOUT = 90.0

#: Patroni's cluster-wide settings (kept in etcd); fast failover on a loaded machine.
_DCS: dict[str, Any] = {
    "ttl": 10,
    "loop_wait": 1,
    "retry_timeout": 4,
    # Async mode must fail over even with a lagging replica: losing its last commits is
    # exactly what the tests look at.
    "maximum_lag_on_failover": 1024**3,
    "synchronous_mode": False,
    "postgresql": {
        "use_pg_rewind": True,
        "use_slots": True,
        "remove_data_directory_on_rewind_failure": True,
        "remove_data_directory_on_diverged_timelines": True,
        "parameters": {
            "wal_level": "replica",
            "hot_standby": "on",
            "wal_log_hints": "on",
            "max_wal_senders": 5,
            "max_replication_slots": 5,
            "wal_keep_size": "128MB",
            "max_connections": 100,
            "shared_buffers": "32MB",
            # The node dies (kill -9 of every process), the machine does not.
            "fsync": "off",
            "wal_receiver_status_interval": "1s",
            "wal_retrieve_retry_interval": "500ms",
            "lc_messages": "C",
        },
    },
}


class PatroniError(AssertionError):
    """The cluster did not reach the state an operation waits for."""


class PatroniCluster:
    """etcd plus Patroni-managed PostgreSQL nodes; see the module docstring."""

    def __init__(
        self,
        *,
        synchronous: bool = False,
        strict: bool = False,
        nodes: int = 2,
        keep: bool = False,
    ) -> None:
        self.nodes = tuple(f"node{i}" for i in range(nodes))
        self._strict = strict
        self._bindir = find_bindir()
        self.base = make_scratch("lq-pat-")  # RAM-backed when there is room: etcd fsyncs
        self._user: ServerUser | None = server_user(self.base / "none")
        give_to(self.base, self._user)
        self.scope = f"leaseq-{self.base.name[-8:]}"
        self._synchronous_at_start = synchronous
        self.keep = keep  # leave the directory (logs) behind on close
        self.etcd_port = _port()
        self.etcd_peer_port = _port()
        self.pg_ports = {name: _port() for name in self.nodes}
        self.api_ports = {name: _port() for name in self.nodes}
        self._etcd: subprocess.Popen[bytes] | None = None
        self._patroni: dict[str, subprocess.Popen[bytes]] = {}
        self._logs: list[Any] = []

    # -- life cycle ---------------------------------------------------------------------

    def start(self) -> PatroniCluster:
        """Start etcd and both nodes; returns once a leader takes writes and a replica
        streams from it (synchronously in synchronous mode), with the ``leaseq`` database."""
        self._start_etcd()
        self._start_patroni(self.nodes[0])
        leader = self.wait_leader()
        with psycopg.connect(self.dsn(leader, "postgres"), autocommit=True) as conn:
            if not conn.execute(
                "SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE,)
            ).fetchone():
                conn.execute(f"CREATE DATABASE {DATABASE}")
        for name in self.nodes[1:]:
            self._start_patroni(name)
        if self._synchronous_at_start:
            self.set_synchronous(True)
        self.wait_healthy()
        return self

    def close(self) -> None:
        """Kill every process of the cluster and remove its directory."""
        try:
            for proc in self._patroni.values():
                _kill(proc.pid)
            for name in self.nodes:
                self._kill_postgres(name)
            if self._etcd is not None:
                _kill(self._etcd.pid)
            self._sweep()
            for proc in [*self._patroni.values(), *([self._etcd] if self._etcd else [])]:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(10)
        finally:
            for log in self._logs:
                log.close()
            if not self.keep:
                shutil.rmtree(self.base, ignore_errors=True)

    def __enter__(self) -> PatroniCluster:
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- addresses ----------------------------------------------------------------------

    def dsn(self, node: str, dbname: str = DATABASE) -> str:
        return (
            f"host={HOST} port={self.pg_ports[node]} dbname={dbname} user={SUPERUSER} "
            "connect_timeout=3"
        )

    def multi_host_dsn(self) -> str:
        """Both nodes in one libpq DSN; libpq keeps the one that takes writes."""
        ports = ",".join(str(self.pg_ports[name]) for name in self.nodes)
        hosts = ",".join(HOST for _ in self.nodes)
        return (
            f"host={hosts} port={ports} dbname={DATABASE} user={SUPERUSER} "
            "connect_timeout=3 target_session_attrs=read-write"
        )

    def node_of_port(self, port: int) -> str:
        return next(name for name, p in self.pg_ports.items() if p == port)

    # -- state --------------------------------------------------------------------------

    def members(self) -> list[dict[str, Any]]:
        """Patroni's view of the cluster (``GET /cluster`` of any node that answers)."""
        for name in self.nodes:
            with contextlib.suppress(OSError, ValueError):
                found = self._api(name, "GET", "/cluster", timeout=2)
                members: list[dict[str, Any]] = found.get("members", [])
                return members
        return []

    def leader(self) -> str | None:
        """The node holding the leader key, if any node's API answers."""
        for member in self.members():
            if member.get("role") == "leader":
                return str(member["name"])
        return None

    def wait_leader(self, timeout: float = _START_TIMEOUT) -> str:
        """Until a node holds the leader key and its server takes writes; returns it."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            leader = self.leader()
            if leader is not None and self._writable(leader):
                return leader
            time.sleep(0.2)
        raise PatroniError(f"no writable leader in {timeout:.0f}s; {self._where()}")

    def wait_healthy(self, timeout: float = _START_TIMEOUT) -> str:
        """Until there is a writable leader and every other node streams from it (one of
        them as the synchronous standby in synchronous mode); returns the leader."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            members = self.members()
            leader = next((str(m["name"]) for m in members if m.get("role") == "leader"), None)
            sync = self.synchronous()
            # In synchronous mode Patroni must also have named the replica its synchronous
            # standby (in etcd), or a switchover to it is refused.
            roles = ("sync_standby",) if sync else ("replica", "sync_standby")
            replica_ready = any(
                m.get("role") in roles and m.get("state") in ("running", "streaming")
                for m in members
            )
            if leader is not None and replica_ready and self._writable(leader):
                with contextlib.suppress(psycopg.Error):
                    with psycopg.connect(self.dsn(leader, "postgres"), autocommit=True) as c:
                        row = c.execute(
                            "SELECT count(*) FILTER (WHERE state = 'streaming'),"
                            " count(*) FILTER (WHERE state = 'streaming'"
                            " AND (NOT %s OR sync_state = 'sync'))"
                            " FROM pg_stat_replication",
                            (sync,),
                        ).fetchone()
                    if row is not None and row[0] >= len(self.nodes) - 1 and row[1] >= 1:
                        return leader
            time.sleep(0.2)
        raise PatroniError(f"cluster not healthy in {timeout:.0f}s; {self._where()}")

    def synchronous(self) -> bool:
        leader = self.leader() or self.nodes[0]
        with contextlib.suppress(OSError, ValueError):
            return bool(self._api(leader, "GET", "/config").get("synchronous_mode"))
        return False

    def replica(self) -> str:
        leader = self.wait_leader()
        return next(name for name in self.nodes if name != leader)

    # -- operations ---------------------------------------------------------------------

    def set_synchronous(self, on: bool) -> None:
        """Patroni's ``synchronous_mode``: every commit waits for the synchronous standby's
        flush (and, when the cluster is ``strict``, for a standby to exist at all)."""
        leader = self.wait_leader()
        change: dict[str, Any] = {"synchronous_mode": on}
        if self._strict:
            change["synchronous_mode_strict"] = on
        self._api(leader, "PATCH", "/config", change)

    def switchover(self, timeout: float = _START_TIMEOUT) -> tuple[str, str]:
        """A managed switchover to the replica; returns (old, new) leader once the old one
        streams from the new one again."""
        old = self.wait_healthy()
        # In synchronous mode only the synchronous standby may take over.
        wanted = "sync_standby" if self.synchronous() else "replica"
        standbys = [str(m["name"]) for m in self.members() if m.get("role") == wanted]
        new = standbys[0] if standbys else next(name for name in self.nodes if name != old)
        self._api(old, "POST", "/switchover", {"leader": old, "candidate": new}, timeout=60)
        deadline = time.monotonic() + timeout
        while self.leader() != new and time.monotonic() < deadline:
            time.sleep(0.2)
        if self.wait_healthy(max(1.0, deadline - time.monotonic())) != new:
            raise PatroniError(f"switchover {old} -> {new} did not happen; {self._where()}")
        return old, new

    def crash_leader(self, replica_lag: float = 0.0) -> str:
        """``kill -9`` of the leader's Patroni, postmaster and backends (frozen first, so no
        client hears a goodbye: its connections just break); returns its name.

        ``replica_lag``: first freeze the leader's WAL senders for that many seconds, so the
        replica misses what the primary commits meanwhile, as a lagging replica would: with
        asynchronous replication those commits are lost by the failover; in synchronous
        mode they wait for the standby and are never acknowledged."""
        old = self.wait_healthy()
        if replica_lag > 0:
            for pid in self._wal_senders(old):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGSTOP)  # killed below with the rest
            time.sleep(replica_lag)
        _kill(self._patroni[old].pid)
        self._patroni[old].wait(10)
        self._kill_postgres(old)
        return old

    def _wal_senders(self, name: str) -> list[int]:
        found = read_pidfile(self.base / name / "data")
        if found is None:
            return []
        with contextlib.suppress(psutil.Error):
            return [
                kid.pid
                for kid in psutil.Process(found.pid).children()
                if "walsender" in " ".join(kid.cmdline())
            ]
        return []

    def restart_node(self, name: str) -> None:
        """Start the node's Patroni again (it rejoins as a replica)."""
        self._start_patroni(name)

    def hard_failover(self, timeout: float = _START_TIMEOUT) -> tuple[str, str]:
        """The leader node dies; the replica is promoted once the leader key expires; the
        dead node comes back as its replica. Returns (old, new) once healthy again."""
        old = self.crash_leader()
        new = self.wait_leader(timeout)
        if new == old:
            raise PatroniError(f"{old} still leads after its crash; {self._where()}")
        self.restart_node(old)
        self.wait_healthy(timeout)
        return old, new

    # -- helpers ------------------------------------------------------------------------

    def _start_etcd(self) -> None:
        data = self.base / "etcd"
        peer = f"http://{HOST}:{self.etcd_peer_port}"
        client = f"http://{HOST}:{self.etcd_port}"
        args = [
            "/usr/bin/etcd",
            "--name=etcd0",
            f"--data-dir={data}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=etcd0={peer}",
            f"--initial-cluster-token={self.scope}",
            "--initial-cluster-state=new",
        ]
        self._etcd = self._spawn(args, "etcd.log", as_server_user=False)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with (
                contextlib.suppress(OSError),
                urllib.request.urlopen(f"{client}/health", timeout=1) as reply,
            ):
                if json.loads(reply.read()).get("health") == "true":
                    return
            time.sleep(0.1)
        raise PatroniError(f"etcd did not start; see {self.base / 'etcd.log'}")

    def _config(self, name: str) -> dict[str, Any]:
        node_dir = self.base / name
        password = {"password": "unused-trust-auth"}
        return {
            "scope": self.scope,
            "namespace": "/leaseq-tests/",
            "name": name,
            "log": {"level": "INFO"},
            "restapi": {
                "listen": f"{HOST}:{self.api_ports[name]}",
                "connect_address": f"{HOST}:{self.api_ports[name]}",
            },
            "etcd3": {"hosts": [f"{HOST}:{self.etcd_port}"]},
            "bootstrap": {
                "dcs": _DCS,
                "initdb": [{"encoding": "UTF8"}, {"locale": "C"}, "no-sync"],
            },
            "postgresql": {
                "listen": f"{HOST}:{self.pg_ports[name]}",
                "connect_address": f"{HOST}:{self.pg_ports[name]}",
                "data_dir": str(node_dir / "data"),
                "bin_dir": str(self._bindir),
                "pgpass": str(node_dir / "pgpass"),
                "authentication": {
                    "superuser": {"username": SUPERUSER, **password},
                    "replication": {"username": REPLICATOR, **password},
                    "rewind": {"username": SUPERUSER, **password},
                },
                "pg_hba": [
                    "local all all trust",
                    f"host all all {HOST}/32 trust",
                    f"host replication all {HOST}/32 trust",
                ],
                "parameters": {"unix_socket_directories": str(node_dir)},
                # A spread checkpoint would hold a clone back for minutes.
                "basebackup": [{"checkpoint": "fast"}],
            },
        }

    def _start_patroni(self, name: str) -> None:
        node_dir = self.base / name
        node_dir.mkdir(exist_ok=True)
        give_to(node_dir, self._user)
        config = node_dir / "patroni.yml"
        config.write_text(json.dumps(self._config(name), indent=1))  # JSON is YAML
        give_to(config, self._user)
        self._patroni[name] = self._spawn(
            ["/usr/bin/patroni", str(config)], f"{name}.log", cwd=node_dir
        )

    def _spawn(
        self,
        args: list[str],
        log_name: str,
        *,
        cwd: pathlib.Path | None = None,
        as_server_user: bool = True,
    ) -> subprocess.Popen[bytes]:
        log = (self.base / log_name).open("ab")
        self._logs.append(log)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PG", "PATRONI"))}
        env["LC_ALL"] = "C"
        user = self._user if as_server_user else None
        if user is not None:
            env["HOME"] = str(self.base)
            env["USER"] = env["LOGNAME"] = user.name
        return subprocess.Popen(
            args,
            cwd=cwd or self.base,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            user=user.uid if user else None,
            group=user.gid if user else None,
            extra_groups=[] if user else None,
        )

    def _kill_postgres(self, name: str) -> None:
        found = read_pidfile(self.base / name / "data")
        if found is None:
            return
        try:
            postmaster = psutil.Process(found.pid)
            backends = postmaster.children()
        except psutil.NoSuchProcess:
            return
        # Freeze them all first: a node that dies sends nothing, whereas a backend that
        # outlived its postmaster for a moment would tell its client 57P01 (admin_shutdown).
        doomed = [postmaster, *backends]
        for proc in doomed:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(proc.pid, signal.SIGSTOP)
        for proc in doomed:
            _kill(proc.pid)

    def _sweep(self) -> None:
        """Kill any process left whose working directory is inside the cluster's."""
        base = str(self.base)
        for proc in psutil.process_iter():
            with contextlib.suppress(psutil.Error, OSError):
                cwd = proc.cwd()
                if cwd == base or cwd.startswith(base + os.sep):
                    _kill(proc.pid)

    def _writable(self, name: str) -> bool:
        try:
            with psycopg.connect(self.dsn(name, "postgres"), autocommit=True) as conn:
                row = conn.execute("SELECT pg_is_in_recovery()").fetchone()
        except psycopg.Error:
            return False
        return row == (False,)

    def _api(
        self,
        name: str,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        *,
        timeout: float = 10,
    ) -> dict[str, Any]:
        url = f"http://{HOST}:{self.api_ports[name]}{path}"
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(url, data=data, method=method)
        request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=timeout) as reply:
                text = reply.read().decode()
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:200]
            raise PatroniError(f"{method} {path} on {name}: HTTP {exc.code} {detail}") from None
        try:
            parsed = json.loads(text)
        except ValueError:
            return {"text": text}
        return parsed if isinstance(parsed, dict) else {"value": parsed}

    def _where(self) -> str:
        state = ", ".join(
            f"{m.get('name')}={m.get('role')}/{m.get('state')}" for m in self.members()
        )
        return f"members: {state or 'no API answers'}; logs in {self.base}"


def _port() -> int:
    return free_port(HOST)


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGKILL)


__all__ = ["DATABASE", "NODES", "PatroniCluster", "PatroniError"]
