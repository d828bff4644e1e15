"""Several hosts: workers in network namespaces of their own (tests/support/netns.py: `ip
netns` and veth pairs; link-local addresses, nothing leaves this machine) share one
PostgreSQL. One host is cut off mid-run: its leases expire, the other host takes its jobs
over, and the cut-off worker's late writes are refused."""

from __future__ import annotations

import pathlib
import signal
import time
from collections.abc import Iterator

import pytest
from psycopg.conninfo import conninfo_to_dict

import leaseq
from leaseq.owners import worker_of
from tests.support.faults import FaultProxy
from tests.support.helpers import rows
from tests.support.netns import Host
from tests.support.netns import hosts as netns_hosts
from tests.support.procs import WorkerProcess, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.requires("root", "ip")]


@pytest.fixture()
def hosts() -> Iterator[list[Host]]:
    with netns_hosts(2, subnet=231) as made:
        yield made


def test_cut_off_host_loses_its_leases_and_its_late_writes_are_refused(
    hosts: list[Host], dsn: str, schema: str, client: leaseq.Client, tmp_path: pathlib.Path
) -> None:
    target = conninfo_to_dict(dsn)
    proxies = [
        FaultProxy(str(target["host"]), int(target["port"]), listen_host=h.gateway) for h in hosts
    ]
    for proxy in proxies:
        proxy.start()
    marker = tmp_path / "ticks"
    slow = client.enqueue_many(
        [{"task": "ticker_sync", "payload": {"marker": str(marker), "seconds": 30, "later": 0.1}}]
        * 4
    )
    fast = client.enqueue_many([{"task": "sleepy"}] * 300)
    args = (
        "--lease-seconds",
        "1.5",
        "--sweep-interval",
        "0.3",
        "--poll-interval",
        "0.05",
        "--op-timeout",
        "1",
        "--concurrency",
        "4",
    )
    a_dsn, b_dsn = (p.dsn(dsn) for p in proxies)
    try:
        with WorkerProcess(
            a_dsn,
            schema,
            *args,
            "--no-listen",
            log_dir=tmp_path,
            wrapper=hosts[0].wrapper,
        ) as a:
            # Host A takes the slow jobs first.
            wait_for(
                lambda: (
                    rows(dsn, "SELECT count(*) FROM {s}.jobs WHERE status = 'running'", schema)
                    == [(4,)]
                ),
                30,
                "host A to hold four leases",
            )
            hosts[0].cut()  # host A is cut off, mid-work
            with WorkerProcess(
                b_dsn,
                schema,
                *args,
                "--drain",
                log_dir=tmp_path,
                wrapper=hosts[1].wrapper,
            ) as b:
                assert b.wait(120) == 0, b.output()
            hosts[0].heal()  # A comes back and tries to report
            wait_for(lambda: "lease lost" in a.output(), 20, "host A to notice its lost leases")
            time.sleep(1.0)
            a.signal(signal.SIGTERM)
            a.wait(30)
            a_out = a.output()
    finally:
        for proxy in proxies:
            proxy.stop()
    states = rows(dsn, "SELECT status::text, count(*) FROM {s}.jobs GROUP BY 1", schema)
    assert states == [("succeeded", len(slow) + len(fast))]
    for job_id in slow:
        job = client.get_job(job_id)
        assert job is not None and job.lease_token >= 2, "B took A's jobs over under new tokens"
        expired = [e for e in client.job_events(job_id) if e.event == "lease_expired"]
        assert expired and expired[0].lease_token == 1
    assert "Traceback" not in a_out
    # The leases that expired were host A's: B's sweeper recovered exactly those.
    owners = rows(
        dsn,
        "SELECT DISTINCT substring(detail from 'lease of (\\S+) expired') FROM "
        "{s}.job_events WHERE event = 'lease_expired'",
        schema,
    )
    workers = {worker_of(owner) for (owner,) in owners}  # one owner per claim, one worker
    assert len(workers) == 1 and f"worker {workers.pop()} started" in a_out
