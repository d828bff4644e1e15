"""Through PgBouncer in transaction pooling mode: enqueue, claims, fenced completions and
key locks work with prepared statements off; LISTEN goes over a direct connection, or the
worker polls."""

from __future__ import annotations

import os
import pathlib
import pwd
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

import leaseq
from leaseq import JobStatus
from tests.support.helpers import expire_lease, make_available, rows
from tests.support.ports import free_port
from tests.support.procs import WorkerProcess
from tests.support.requires import tool_path

pytestmark = [pytest.mark.slow, pytest.mark.requires("pgbouncer")]


@pytest.fixture(scope="module")
def bouncer_dsn(dsn: str) -> Iterator[str]:
    """A PgBouncer (transaction pooling) in front of the test server, on loopback."""
    target = conninfo_to_dict(dsn)
    pgbouncer = tool_path("pgbouncer")
    port = free_port()
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="leaseq-pgbouncer-", dir="/var/tmp"))
    (workdir / "userlist.txt").write_text(f'"{target.get("user", "leaseq")}" ""\n')
    (workdir / "pgbouncer.ini").write_text(
        "[databases]\n"
        f"* = host={target.get('host', '127.0.0.1')} port={target.get('port', 5432)}\n"
        "[pgbouncer]\n"
        f"listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n"
        "pool_mode = transaction\nauth_type = trust\n"
        f"auth_file = {workdir / 'userlist.txt'}\n"
        "max_client_conn = 500\ndefault_pool_size = 20\n"
        f"logfile = {workdir / 'pgbouncer.log'}\npidfile = {workdir / 'pgbouncer.pid'}\n"
    )
    user = None
    if os.geteuid() == 0:  # pgbouncer refuses to run as root
        user = "postgres" if _has_user("postgres") else "nobody"
        shutil.chown(workdir, user)
        for item in workdir.iterdir():
            shutil.chown(item, user)
    proc = subprocess.Popen(
        [pgbouncer, str(workdir / "pgbouncer.ini")],
        user=user,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    bouncer = make_conninfo(dsn, host="127.0.0.1", port=str(port))
    try:
        deadline = time.monotonic() + 15
        while True:
            try:
                psycopg.connect(bouncer, connect_timeout=2).close()
                break
            except psycopg.OperationalError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    log = (
                        (workdir / "pgbouncer.log").read_text()
                        if (workdir / "pgbouncer.log").exists()
                        else ""
                    )
                    raise RuntimeError(f"pgbouncer did not start: {log[-500:]}") from None
                time.sleep(0.1)
        yield bouncer
    finally:
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(workdir, ignore_errors=True)


def _has_user(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


def test_client_lifecycle_through_pgbouncer(bouncer_dsn: str, dsn: str, schema: str) -> None:
    client = leaseq.Client(bouncer_dsn, schema=schema, prepare=False)
    try:
        client.migrate()
        ids = [client.enqueue("t", {"i": i}) for i in range(30)]  # > psycopg's prepare threshold
        ids += client.enqueue_many([{"task": "t", "ordering_key": "k"}] * 3)
        done = 0
        while leases := client.claim(worker="w", limit=7):
            for lease in leases:
                assert client.heartbeat(lease)
                assert client.complete(lease)
                done += 1
        assert done == len(ids)
        # A stale worker is fenced out through the pooler as well.
        job_id = client.enqueue("t")
        (old,) = client.claim(worker="a")
        expire_lease(dsn, schema, job_id)
        client.sweep()
        make_available(dsn, schema)
        (new,) = client.claim(worker="b")
        assert client.complete(old) is False and client.complete(new) is True
    finally:
        client.close()


@pytest.mark.parametrize("listen", ["direct", "off"])
def test_worker_drains_through_pgbouncer(
    bouncer_dsn: str, dsn: str, schema: str, tmp_path: pathlib.Path, listen: str
) -> None:
    client = leaseq.Client(dsn, schema=schema)
    client.migrate()
    total = len(client.enqueue_many([{"task": "noop"}] * 300))
    extra = ["--listen-dsn", dsn] if listen == "direct" else ["--no-listen"]
    env_dsn = bouncer_dsn
    with WorkerProcess(
        env_dsn,
        schema,
        "--drain",
        "--poll-interval",
        "0.05",
        *extra,
        log_dir=tmp_path,
        global_args=("--no-prepare",),
    ) as worker:
        assert worker.wait(60) == 0, worker.output()
    assert rows(dsn, "SELECT count(*) FROM {s}.jobs WHERE status = 'succeeded'", schema) == [
        (total,)
    ]
    job = client.get_job(1)
    assert job is not None and job.status is JobStatus.SUCCEEDED
    client.close()
