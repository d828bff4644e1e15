"""The re-read after a fenced write of unknown outcome (``attempts_ended``): it names an
attempt only when the lease's own write ended it, never the sweep's or a later claim's."""

from __future__ import annotations

import leaseq
from leaseq import JobStatus
from tests.support.helpers import expire_lease, make_available


def test_own_completion_and_own_failure_are_found(client: leaseq.Client) -> None:
    done, failed, running = (client.enqueue("t") for _ in range(3))
    leases = {lease.job_id: lease for lease in client.claim(worker="w", limit=3)}
    assert client.complete(leases[done])
    assert client.fail(leases[failed], "BOOM", retryable=True)
    assert client.attempts_ended(list(leases.values())) == {
        done: JobStatus.SUCCEEDED,
        failed: JobStatus.PENDING,
    }
    assert running in leases  # still running: not ended, not named


def test_an_attempt_the_sweep_ended_is_not_taken_for_the_leases_own_failure(
    client: leaseq.Client, dsn: str, schema: str
) -> None:
    job_id = client.enqueue("t")
    [lease] = client.claim(worker="w")
    expire_lease(dsn, schema, job_id)
    client.sweep()
    job = client.get_job(job_id)
    assert job is not None and job.status == JobStatus.PENDING and job.lease_token == lease.token
    assert client.attempts_ended([lease]) == {}


def test_an_attempt_claimed_again_and_completed_is_not_named(
    client: leaseq.Client, dsn: str, schema: str
) -> None:
    job_id = client.enqueue("t")
    [first] = client.claim(worker="w")
    expire_lease(dsn, schema, job_id)
    client.sweep()
    make_available(dsn, schema)
    [second] = client.claim(worker="w")
    assert client.complete(second)
    assert client.attempts_ended([first]) == {}
    assert client.attempts_ended([second]) == {job_id: JobStatus.SUCCEEDED}
