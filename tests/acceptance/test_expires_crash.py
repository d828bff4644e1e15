"""A start deadline across a crash: a real worker is killed (-9) in the middle of a job
whose deadline then passes. The sweep requeues the expired lease, and the deadline holds for
every attempt's start: no worker starts it again, it ends cancelled with EXPIRED, once."""

from __future__ import annotations

import pathlib
import signal

import pytest

import leaseq
from leaseq import JobStatus
from tests.support.helpers import rows, run_sql
from tests.support.procs import WorkerProcess, wait_for

pytestmark = pytest.mark.slow  # real worker processes, killed


def test_a_job_killed_mid_run_is_not_started_again_after_its_deadline(
    dsn: str, schema: str, client: leaseq.Client, tmp_path: pathlib.Path
) -> None:
    marker = tmp_path / "runs"
    job_id = client.enqueue(
        "touch_then_sleep", {"marker": str(marker), "seconds": 60}, expires=3600
    )
    args = ("--lease-seconds", "1", "--poll-interval", "0.05", "--sweep-interval", "60")
    with WorkerProcess(dsn, schema, *args, log_dir=tmp_path) as a:
        wait_for(marker.exists, 30, "worker A to start the job")
        a.signal(signal.SIGKILL)
        a.wait(30)
    # The deadline passes while the job is still held by the dead worker's lease.
    run_sql(dsn, "UPDATE {s}.jobs SET expires_at = now() WHERE id = %s", schema, job_id)
    with WorkerProcess(
        dsn, schema, "--poll-interval", "0.05", "--sweep-interval", "0.1", log_dir=tmp_path
    ):
        wait_for(
            lambda: (j := client.get_job(job_id)) is not None and j.status.terminal,
            60,
            "the sweep to end the job",
        )
    job = client.get_job(job_id)
    assert job is not None and job.status is JobStatus.CANCELLED
    assert job.last_error_code == "EXPIRED" and job.attempt_count == 1
    assert len(marker.read_text().splitlines()) == 1, "started once, never again"
    trail = rows(
        dsn, "SELECT event FROM {s}.job_events WHERE job_id = %s ORDER BY id", schema, job_id
    )
    assert [t[0] for t in trail] == ["lease_expired", "expired"]
