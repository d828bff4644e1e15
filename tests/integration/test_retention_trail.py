"""What retention removes of the audit trail, and what it leaves, as docs/operations.md
(Retention) states it: pruning a succeeded or cancelled job takes its ``job_events`` with
it (a replayed job's record of its replay too); the trail of a purged dead job, and the
operators' ``admin_events``, survive every prune.

The boundary: one prune over a schema holding all three kinds, everything finished long
past the retention window.
"""

from __future__ import annotations

import leaseq
from tests.support.helpers import rows, run_sql


def _dead(client: leaseq.Client, queue: str) -> int:
    job = int(client.enqueue("t", queue=queue, max_attempts=1))
    (lease,) = client.claim(queue, worker="w")
    assert client.fail(lease, "BOOM", retryable=False)
    return job


def test_a_prune_takes_a_finished_jobs_trail_but_keeps_purged_trails_and_admin_events(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    purged = _dead(client, "purgeq")
    assert client.purge_dead(reason="cleanup", actor="ops", queue="purgeq") == 1
    replayed = _dead(client, "replayq")
    assert client.replay(replayed, reason="fixed", actor="ops")
    (lease,) = client.claim("replayq", worker="w")
    assert client.complete(lease)
    assert {e.event for e in client.job_events(replayed)} >= {"dead", "replayed"}
    assert client.pause("pauseq", reason="maintenance", actor="ops")
    assert client.resume("pauseq", actor="ops")
    run_sql(dsn, "UPDATE {s}.jobs SET finished_at = now() - interval '10 days'", schema)
    run_sql(dsn, "UPDATE {s}.job_events SET at = now() - interval '10 days'", schema)
    run_sql(dsn, "UPDATE {s}.admin_events SET at = now() - interval '10 days'", schema)

    assert client.prune(older_than=86400) == 1  # the replayed job, succeeded since

    assert client.get_job(replayed) is None
    assert client.job_events(replayed) == [], "a pruned job's trail goes with it"
    assert [e.event for e in client.job_events(purged)] == ["dead", "purged"]
    assert [e.action for e in client.admin_events(scope="queue", value="pauseq")] == [
        "resume",
        "pause",
    ]
    ((orphans,),) = rows(
        dsn,
        "SELECT count(*) FROM {s}.job_events e WHERE NOT EXISTS "
        "(SELECT 1 FROM {s}.jobs j WHERE j.id = e.job_id)",
        schema,
    )
    assert orphans == 2, "only the purged job's trail outlives its job"
