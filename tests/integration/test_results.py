"""Stored results on a real PostgreSQL: written by the fenced completion's transaction for
the jobs it took (a stale worker's late completion stores nothing), read back or waited for
with result() (LISTEN plus a safety poll), with distinct errors for timeout, dead and
cancelled jobs, and read by dependents."""

from __future__ import annotations

import asyncio
import statistics
import threading
import time
from typing import Any

import pytest

import leaseq
from leaseq import JobStatus
from leaseq.testing.perform import perform_job
from tests.support.helpers import expire_lease, rows

FAST = leaseq.RetryPolicy(base=0.001, cap=0.01)


def _run(app: leaseq.App) -> leaseq.WorkerStats:
    config = leaseq.WorkerConfig(poll_interval=0.02, drain=True, concurrency=4)
    return asyncio.run(leaseq.Worker(app, config).run())


def _stored(dsn: str, schema: str) -> list[tuple[Any, ...]]:
    return rows(dsn, "SELECT job_id, value, lease_token FROM {s}.job_results ORDER BY 1", schema)


def test_stale_completion_stores_no_result(client: leaseq.Client, dsn: str, schema: str) -> None:
    job = client.enqueue("t")
    (stale,) = client.claim("default", worker="a")
    expire_lease(dsn, schema, job)
    client.sweep()
    rows(dsn, "UPDATE {s}.jobs SET available_at = now() WHERE id = %s RETURNING 1", schema, job)
    (fresh,) = client.claim("default", worker="b")
    assert not client.complete_many([stale], results={job: ('"stale"', 60.0)})
    assert _stored(dsn, schema) == []
    assert client.complete_many([fresh], results={job: ('"fresh"', 60.0)}) == {job}
    assert _stored(dsn, schema) == [(job, "fresh", fresh.token)]
    assert client.result(job, timeout=1) == "fresh"


def test_worker_stores_the_return_value_and_dependents_read_it(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    app = leaseq.App(dsn, schema=schema, retry_policy=FAST)
    seen: dict[int, Any] = {}

    @app.task(name="render", store_result=True)
    def render(ctx: leaseq.JobContext, payload: Any) -> Any:
        return {"page": payload, "url": f"/p/{payload}.png"}

    @app.task(name="zip", store_result=True)
    async def zip_pages(ctx: leaseq.JobContext, payload: Any) -> Any:
        found = await ctx.dependency_results_async()
        seen.update({k: v.value for k, v in found.items()})
        return sorted(v.value["url"] for v in found.values())

    pages = [render.enqueue(i) for i in range(3)]
    bundle = zip_pages.enqueue(None, depends_on=pages)
    _run(app)
    assert seen == {int(p): {"page": i, "url": f"/p/{i}.png"} for i, p in enumerate(pages)}
    assert client.result(bundle, timeout=1) == ["/p/0.png", "/p/1.png", "/p/2.png"]


def test_a_result_over_the_cap_fails_the_job_permanently(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    app = leaseq.App(dsn, schema=schema, retry_policy=FAST)

    @app.task(name="big", store_result=True, result_limit=100)
    def big(ctx: leaseq.JobContext, payload: Any) -> Any:
        return "x" * 200

    job = big.enqueue(None)
    _run(app)
    found = client.get_job(job)
    assert found is not None and found.status is JobStatus.DEAD
    assert found.last_error_code == "RESULT_TOO_LARGE" and found.attempt_count == 1
    with pytest.raises(leaseq.JobDead, match="RESULT_TOO_LARGE"):
        client.result(job, timeout=1)
    assert _stored(dsn, schema) == []


def test_result_errors_are_distinct(client: leaseq.Client) -> None:
    pending = client.enqueue("t")
    with pytest.raises(leaseq.ResultTimeout):
        client.result(pending, timeout=0.05, poll_interval=0.01)
    dead = client.enqueue("t", max_attempts=1, queue="d")
    (lease,) = client.claim("d", worker="w")
    client.fail(lease, "BOOM", retryable=False, detail="upstream said no")
    with pytest.raises(leaseq.JobDead) as died:
        client.result(dead, timeout=1)
    assert died.value.error_code == "BOOM" and died.value.status == "dead"
    assert client.cancel(pending)
    with pytest.raises(leaseq.JobCancelled):
        client.result(pending, timeout=1)
    with pytest.raises(leaseq.JobNotFound):
        client.result(10**12, timeout=1)


def test_job_without_stored_result_returns_none(client: leaseq.Client) -> None:
    job = client.enqueue("t")
    (lease,) = client.claim("default", worker="w")
    client.complete(lease)
    assert client.result(job, timeout=1) is None


def _wait_in_thread(client: leaseq.Client, job: int, out: dict[str, Any], **kw: Any) -> None:
    out["value"] = client.result(job, **kw)
    out["returned"] = time.perf_counter()


def test_result_returns_within_milliseconds_of_the_commit(client: leaseq.Client) -> None:
    """Woken by the completion's notification, not the poll (poll_interval is 30 s)."""
    latencies = []
    for i in range(10):
        job = client.enqueue("t", i)
        out: dict[str, Any] = {}
        thread = threading.Thread(
            target=_wait_in_thread, args=(client, job, out), kwargs={"poll_interval": 30}
        )
        thread.start()
        time.sleep(0.05)  # let it LISTEN
        (lease,) = client.claim("default", worker="w")
        client.complete_many([lease], results={job: (str(i), 60.0)})
        committed = time.perf_counter()
        thread.join(10)
        assert out["value"] == i
        latencies.append(out["returned"] - committed)
    print(
        f"result() after commit: median {statistics.median(latencies) * 1000:.2f} ms, "
        f"max {max(latencies) * 1000:.2f} ms"
    )
    assert max(latencies) < 5  # far below the 30 s poll: the notification woke it


def test_result_survives_a_dropped_listener(client: leaseq.Client, dsn: str, schema: str) -> None:
    job = client.enqueue("t")
    out: dict[str, Any] = {}
    thread = threading.Thread(
        target=_wait_in_thread, args=(client, job, out), kwargs={"poll_interval": 0.1}
    )
    thread.start()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        killed = rows(
            dsn,
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE query LIKE %s AND pid <> pg_backend_pid()",
            schema,
            f'LISTEN "leaseq.r.{schema}"%',
        )
        if killed:
            break
        time.sleep(0.01)
    assert killed, "the listener never showed up"
    (lease,) = client.claim("default", worker="w")
    client.complete_many([lease], results={job: ("42", 60.0)})
    thread.join(10)
    assert out["value"] == 42


def test_results_expire_on_their_own_retention(
    client: leaseq.Client, dsn: str, schema: str
) -> None:
    job = client.enqueue("t")
    (lease,) = client.claim("default", worker="w")
    client.complete_many([lease], results={job: ("1", 60.0)})
    assert client.prune(older_than=0.001) == 1  # the job row goes, its result stays
    assert client.result(job, timeout=1) == 1
    rows(dsn, "UPDATE {s}.job_results SET expires_at = now() RETURNING 1", schema)
    client.sweep()
    assert _stored(dsn, schema) == []


@pytest.mark.parametrize(
    ("value", "code"),
    [("x" * 200, "RESULT_TOO_LARGE"), ({"when": float("nan")}, "RESULT_INVALID")],
    ids=["too-large", "not-json"],
)
def test_perform_job_ends_a_result_that_cannot_be_stored_as_a_worker_does(
    dsn: str, schema: str, client: leaseq.Client, value: Any, code: str
) -> None:
    """The boundary: the handler returned, its result cannot be stored. The testing kit
    once let such a job succeed (it re-wrote the attempt and skipped the result checks)
    while a worker ends it dead: both now decide with leaseq.worker.attempt, so the job
    a test performs ends exactly as the one a worker runs."""
    app = leaseq.App(dsn, schema=schema, retry_policy=FAST)

    @app.task(name="big", store_result=True, result_limit=100)
    def big(ctx: leaseq.JobContext, payload: Any) -> Any:
        return value

    on_worker = big.enqueue(None)
    _run(app)
    by_kit = perform_job(client, big, None)

    worker_job, kit_job = client.get_job(on_worker), client.get_job(by_kit.job_id)
    assert worker_job is not None and kit_job is not None
    ended = [
        (j.status, j.last_error_code, j.last_error_class, j.attempt_count)
        for j in (worker_job, kit_job)
    ]
    assert ended[0] == ended[1] == (JobStatus.DEAD, code, "permanent", 1)
    assert (by_kit.status, by_kit.error_code) == ("dead", code)
    assert worker_job.last_error_detail == kit_job.last_error_detail
    assert _stored(dsn, schema) == []


def test_perform_job_stores_a_result_as_a_worker_does(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    app = leaseq.App(dsn, schema=schema, retry_policy=FAST)

    @app.task(name="small", store_result=True)
    def small(ctx: leaseq.JobContext, payload: Any) -> Any:
        return {"n": payload}

    outcome = perform_job(client, small, 7)
    assert outcome.succeeded and outcome.result == {"n": 7}
    assert client.result(outcome.job_id, timeout=1) == {"n": 7}
