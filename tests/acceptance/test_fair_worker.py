"""A fair queue drained by a real worker process (concurrency 10): the worker's claims take
the fair statement (after claim_jobs's LQ010), every job runs once, and the small keys
enqueued after a large one all start before the large one's 200th job (scaled down from the
issue's 1,000,000 and 2,000th; the claim looks at a bounded number of keys and jobs)."""

from __future__ import annotations

import pathlib

import pytest

import leaseq
from tests.support.helpers import rows
from tests.support.procs import WorkerProcess

pytestmark = pytest.mark.slow  # a real worker process


def test_a_real_worker_drains_a_fair_queue_in_turns(
    dsn: str, schema: str, client: leaseq.Client, tmp_path: pathlib.Path
) -> None:
    client.enqueue_many([{"task": "noop", "fairness_key": "A"} for _ in range(3000)])
    client.enqueue_many(
        [{"task": "noop", "fairness_key": k} for k in "BCDEFGHIJK" for _ in range(10)]
    )
    args = ("--drain", "--concurrency", "10", "--poll-interval", "0.05")
    with WorkerProcess(dsn, schema, *args, log_dir=tmp_path) as worker:
        assert worker.wait(300) == 0, worker.output()
    ((left,),) = rows(dsn, "SELECT count(*) FROM {s}.jobs WHERE status <> 'succeeded'", schema)
    assert left == 0
    started = rows(dsn, "SELECT fairness_key FROM {s}.jobs ORDER BY started_at, id", schema)
    a_before = 0
    others = 100
    for (key,) in started:
        if key == "A":
            a_before += 1
        else:
            others -= 1
            if others == 0:
                break
    assert others == 0 and a_before < 200, a_before
