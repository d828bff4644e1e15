"""Seed test 5: heartbeats lost during active work. Worker A reaches the database through a
proxy that we stall mid-job, so its renewals hang; worker B takes the job over after the
lease expires. We measure how long both ran the job at once and check the promised bound
(lease length + sweep interval)."""

from __future__ import annotations

import pathlib
import signal

import psycopg.conninfo
import pytest

import leaseq
from leaseq import JobStatus
from tests.support.faults import FaultProxy
from tests.support.procs import WorkerProcess, wait_for

pytestmark = pytest.mark.slow  # two worker processes through a stalled proxy, per task kind

LEASE = 1.5
SWEEP = 0.3
MARGIN = 0.5


def _ticks(marker: pathlib.Path) -> dict[int, list[float]]:
    found: dict[int, list[float]] = {}
    for line in marker.read_text().splitlines():
        token, at = line.split()
        found.setdefault(int(token), []).append(float(at))
    return found


@pytest.mark.parametrize("task", ["ticker", "ticker_sync"])
def test_seed_5_duplicate_execution_window_is_bounded(
    dsn: str, schema: str, client: leaseq.Client, tmp_path: pathlib.Path, task: str
) -> None:
    parts = psycopg.conninfo.conninfo_to_dict(dsn)
    marker = tmp_path / "ticks"
    job_id = client.enqueue(task, {"marker": str(marker), "seconds": 30, "later": 0.5})
    with FaultProxy(str(parts.get("host", "127.0.0.1")), int(parts.get("port", 5432))) as proxy:
        a_args = (
            "--lease-seconds",
            str(LEASE),
            "--sweep-interval",
            "60",
            "--no-listen",
            "--poll-interval",
            "0.05",
            "--op-timeout",
            "1",
        )
        with WorkerProcess(proxy.dsn(dsn), schema, *a_args, log_dir=tmp_path) as a:
            wait_for(lambda: marker.exists() and bool(_ticks(marker).get(1)), 30, "A to start")
            proxy.stall()  # A keeps working, but can no longer renew (or learn anything)
            b_args = ("--drain", "--sweep-interval", str(SWEEP), "--poll-interval", "0.05")
            with WorkerProcess(dsn, schema, *b_args, log_dir=tmp_path) as b:
                assert b.wait(60) == 0, b.output()
            ticks = _ticks(marker)
            a_last, b_first = max(ticks[1]), min(ticks[2])
            overlap = max(0.0, a_last - b_first)
            print(
                f"\n{task}: A stopped {b_first - a_last:+.3f}s before B started; "
                f"duplicate window {overlap:.3f}s (bound {LEASE + SWEEP:.1f}s)"
            )
            assert overlap <= LEASE + SWEEP + MARGIN
            proxy.resume()
            wait_for(lambda: "lease lost" in a.output(), 10, "A to log its lost lease")
            a.signal(signal.SIGTERM)
            assert a.wait(30) == 0, a.output()
    assert max(ticks[1]) < max(ticks[2]), "A must not keep running after B finished"
    job = client.get_job(job_id)
    assert job is not None and (job.status, job.lease_token) == (JobStatus.SUCCEEDED, 2)
