"""A fair queue drained by a real worker process (concurrency 10): the worker's claims take
the fair statement (after claim_jobs's LQ010), every job runs once, and the small keys
enqueued after a large one all start before the large one's 200th job (scaled down from the
issue's 1,000,000 and 2,000th; the claim looks at a bounded number of keys and jobs); a
job a worker killed -9 was running unparks its key when the sweep takes it back."""

from __future__ import annotations

import pathlib

import pytest

import leaseq
from tests.support.helpers import rows, run_sql
from tests.support.procs import WorkerProcess, wait_for

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


def test_a_job_a_killed_worker_held_unparks_its_key_when_swept(
    dsn: str, schema: str, client: leaseq.Client, tmp_path: pathlib.Path
) -> None:
    # A worker killed -9 in the middle of a fair key's only job: the key had nothing else
    # claimable and is parked (here for a minute, far longer than the test's steps). The
    # sweep that takes the expired lease back makes the job pending in its own transaction,
    # which unparks the key (migration 0029's trigger); the key is then parked at most
    # until the retry's time, and the first claim after that time takes the job.
    job = client.enqueue("sleepy", {"seconds": 120}, fairness_key="x")
    client.enqueue_many([{"task": "noop", "fairness_key": "other"} for _ in range(20)])
    args = ("--concurrency", "1", "--lease-seconds", "2", "--poll-interval", "0.05")
    with WorkerProcess(dsn, schema, *args, log_dir=tmp_path) as worker:
        wait_for(
            lambda: (
                rows(dsn, "SELECT status::text FROM {s}.jobs WHERE id = %s", schema, job)
                == [("running",)]
            ),
            60,
            "the worker to run the job",
        )
        worker.kill()  # SIGKILL
    run_sql(
        dsn,
        "UPDATE {s}.fair_keys SET parked_until = now() + interval '60 seconds', park_step = 5 "
        "WHERE fairness_key = 'x'",
        schema,
    )
    wait_for(
        lambda: (
            rows(dsn, "SELECT lease_expires_at <= now() FROM {s}.jobs WHERE id = %s", schema, job)
            == [(True,)]
        ),
        60,
        "the dead worker's lease to expire",
    )
    assert client.sweep().requeued == 1
    ((parked_until,),) = rows(
        dsn, "SELECT parked_until FROM {s}.fair_keys WHERE fairness_key = 'x'", schema
    )
    assert parked_until is None, "the sweep's transaction unparked the key"
    client.claim("default", worker="w", limit=30)  # the job is in its backoff yet, or taken
    ((status, available_at, parked_until),) = rows(
        dsn,
        "SELECT j.status::text, j.available_at, f.parked_until FROM {s}.jobs AS j, "
        "{s}.fair_keys AS f WHERE j.id = %s AND f.fairness_key = 'x'",
        schema,
        job,
    )
    if status == "pending":
        assert parked_until is None or parked_until <= available_at
        wait_for(
            lambda: rows(dsn, "SELECT %s::timestamptz <= now()", "s", available_at) == [(True,)],
            60,
            "the retry's time",
        )
        assert job in [x.job_id for x in client.claim("default", worker="w", limit=30)]


def test_the_issues_flood_one_million_jobs_of_a_and_ten_keys_after_them(
    dsn: str, schema: str, client: leaseq.Client, tmp_path: pathlib.Path
) -> None:
    # Issue 32's exact claim: A enqueues 1,000,000 jobs, then B..K 10 each; one worker at
    # concurrency 10; every B..K job starts before A's 2,000th. A's jobs are written in one
    # INSERT (the last one through the client, which touches A's fair_keys row as every
    # enqueue does); the queue is paused meanwhile so that the count is the claim order's.
    client.pause("default", reason="loading")
    run_sql(
        dsn,
        "INSERT INTO {s}.jobs (queue_name, task, payload, fairness_key) "
        "SELECT 'default', 'noop', jsonb_build_object('n', g), 'A' "
        "FROM generate_series(1, 999999) AS g",
        schema,
    )
    client.enqueue("noop", fairness_key="A")
    run_sql(dsn, "ANALYZE {s}.jobs", schema)
    ids = client.enqueue_many(
        [{"task": "noop", "fairness_key": k} for k in "BCDEFGHIJK" for _ in range(10)]
    )
    client.resume("default", reason="go")
    args = ("--concurrency", "10", "--poll-interval", "0.05")
    with WorkerProcess(dsn, schema, *args, log_dir=tmp_path):
        wait_for(
            lambda: (
                rows(
                    dsn,
                    "SELECT count(*) FROM {s}.jobs WHERE id = ANY(%s) AND status = 'succeeded'",
                    schema,
                    [int(i) for i in ids],
                )
                == [(100,)]
            ),
            300,
            "B..K's jobs to run",
        )
    ((a_before,),) = rows(
        dsn,
        "SELECT count(*) FROM {s}.jobs WHERE fairness_key = 'A' AND started_at <= "
        "(SELECT max(started_at) FROM {s}.jobs WHERE id = ANY(%s))",
        schema,
        [int(i) for i in ids],
    )
    assert a_before < 2000, a_before
