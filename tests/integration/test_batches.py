"""Batches, chains and groups on a real PostgreSQL: callbacks are ordinary jobs enqueued
exactly once, by the transaction that ended the last job of a sealed batch (or by the
seal), with the batch's counts; an open batch never fires."""

from __future__ import annotations

import threading
import time
from typing import Any

import psycopg
import pytest

import leaseq
from leaseq import Sig
from tests.support.helpers import rows


def _drain(client: leaseq.Client, queue: str = "default", fail: frozenset[int] = frozenset()):
    """Run every claimable job of ``queue`` (failing those in ``fail`` for good)."""
    ran = []
    while leases := client.claim(queue, worker="w", limit=50):
        for lease in leases:
            ran.append(lease.job_id)
            if lease.job_id in fail:
                client.fail(lease, "BOOM", retryable=False)
            else:
                client.complete(lease)
    return ran


def _callbacks(dsn: str, schema: str) -> list[tuple[Any, ...]]:
    return rows(
        dsn,
        "SELECT k.batch_id, k.kind, j.task, j.payload FROM {s}.batch_callbacks AS k "
        "JOIN {s}.jobs AS j ON j.id = k.job_id ORDER BY 1, 2",
        schema,
    )


def test_success_callback_fires_once_with_counts(
    client: leaseq.Client, dsn: str, schema: str
) -> None:
    with client.batch(
        on_success=Sig("report", {"campaign": 7}, {"queue": "cb"}),
        on_failure=Sig("alert", None, {"queue": "cb"}),
        on_finish=Sig("cleanup", None, {"queue": "cb"}),
    ) as batch:
        for i in range(5):
            batch.enqueue("send", i)
    _drain(client)
    assert _callbacks(dsn, schema) == [
        (
            batch.id,
            "finish",
            "cleanup",
            {
                "batch_id": batch.id,
                "kind": "finish",
                "total": 5,
                "succeeded": 5,
                "dead": 0,
                "cancelled": 0,
                "payload": None,
            },
        ),
        (
            batch.id,
            "success",
            "report",
            {
                "batch_id": batch.id,
                "kind": "success",
                "total": 5,
                "succeeded": 5,
                "dead": 0,
                "cancelled": 0,
                "payload": {"campaign": 7},
            },
        ),
    ]
    info = client.get_batch(batch.id)
    assert info is not None and info.state == "done" and info.counts == {"succeeded": 5}
    assert len(_drain(client, "cb")) == 2
    assert len(_callbacks(dsn, schema)) == 2  # nothing fires twice


def test_failure_callback_when_a_job_ends_dead(
    client: leaseq.Client, dsn: str, schema: str
) -> None:
    with client.batch(on_success=Sig("report"), on_failure=Sig("alert")) as batch:
        ids = batch.enqueue_many([{"task": "send", "max_attempts": 1} for _ in range(3)])
    _drain(client, fail=frozenset({int(ids[1])}))
    ((batch_id, kind, task, payload),) = _callbacks(dsn, schema)
    assert (batch_id, kind, task) == (batch.id, "failure", "alert")
    assert (payload["succeeded"], payload["dead"]) == (2, 1)


def test_an_open_batch_never_fires(client: leaseq.Client, dsn: str, schema: str) -> None:
    batch_id = client.create_batch(on_finish=Sig("done"))
    client.enqueue("send", batch_id=batch_id)
    _drain(client)
    assert _callbacks(dsn, schema) == []
    assert client.get_batch(batch_id).state == "open"  # type: ignore[union-attr]
    # Sealed after its jobs ended: the seal fires it.
    assert client.seal_batch(batch_id)
    assert [r[1] for r in _callbacks(dsn, schema)] == ["finish"]
    assert not client.seal_batch(batch_id)


def test_a_block_that_raises_leaves_the_batch_open(client: leaseq.Client) -> None:
    with pytest.raises(RuntimeError), client.batch(on_finish=Sig("done")) as batch:
        batch.enqueue("send")
        raise RuntimeError("producer failed")
    _drain(client)
    assert client.get_batch(batch.id).state == "open"  # type: ignore[union-attr]


def test_enqueue_into_a_sealed_batch_is_refused_and_stores_nothing(
    client: leaseq.Client, dsn: str, schema: str
) -> None:
    with client.batch() as batch:
        batch.enqueue("send")
    with pytest.raises(leaseq.ConfigError, match="is sealed"):
        batch.enqueue("send")
    with pytest.raises(leaseq.ConfigError, match="no batch"):
        client.enqueue("send", batch_id=10**9)
    assert rows(dsn, "SELECT count(*) FROM {s}.jobs", schema)[0][0] == 1


def _complete_and_commit(
    client: leaseq.Client,
    lease: leaseq.Lease,
    conn: psycopg.Connection[tuple[object, ...]],
    done: threading.Event,
) -> None:
    assert client.complete(lease, connection=conn)
    conn.commit()
    done.set()


def test_last_two_jobs_ending_at_once_fire_exactly_once(
    client: leaseq.Client, dsn: str, schema: str
) -> None:
    with client.batch(on_finish=Sig("done", None, {"queue": "cb"})) as batch:
        batch.enqueue_many([{"task": "send"}, {"task": "send"}])
    a, b = client.claim(worker="w", limit=2)
    with psycopg.connect(dsn) as c1, psycopg.connect(dsn) as c2:
        assert client.complete(a, connection=c1)  # open transaction, holds the batch row
        done = threading.Event()
        thread = threading.Thread(target=_complete_and_commit, args=(client, b, c2, done))
        thread.start()
        time.sleep(0.1)
        assert not done.is_set(), "the second ending did not wait for the batch lock"
        c1.commit()
        thread.join(10)
        assert done.is_set()
    assert [r[1] for r in _callbacks(dsn, schema)] == ["finish"]
    assert len(client.claim("cb", worker="w", limit=10)) == 1


def test_chain_with_a_group_runs_in_order(client: leaseq.Client) -> None:
    flow = leaseq.chain(Sig("a"), leaseq.group(Sig("b1"), Sig("b2"), Sig("b3")), Sig("c", {"x": 1}))
    ids = client.enqueue_flow(flow)
    assert len(ids) == 5
    order = []
    while leases := client.claim(worker="w", limit=10):
        order.append(sorted(lease.task for lease in leases))
        for lease in leases:
            client.complete(lease)
    assert order == [["a"], ["b1", "b2", "b3"], ["c"]]


def test_task_sig_carries_the_tasks_options(dsn: str, schema: str, client: leaseq.Client) -> None:
    app = leaseq.App(dsn, schema=schema)

    @app.task(name="render", queue="media", priority=3)
    def render(ctx: leaseq.JobContext, payload: Any) -> None:
        pass

    sig = render.sig({"page": 1}, max_attempts=2)
    assert sig == Sig("render", {"page": 1}, {"queue": "media", "max_attempts": 2, "priority": 3})
    with pytest.raises(leaseq.ConfigError):
        leaseq.chain()
    with pytest.raises(leaseq.ConfigError, match="cannot carry"):
        Sig("t", None, {"depends_on": [1]})


async def test_async_batch_flow_and_result(aclient: leaseq.AsyncClient) -> None:
    async with aclient.batch(on_finish=Sig("done", None, {"queue": "cb"})) as batch:
        ids = await batch.enqueue_flow(leaseq.chain(Sig("a"), Sig("b")))
    assert len(ids) == 2
    while leases := await aclient.claim(worker="w", limit=10):
        await aclient.complete_many(
            leases, results={x.job_id: (f'"{x.task}"', 60.0) for x in leases}
        )
    assert await aclient.result(ids[1], timeout=1) == "b"
    info = await aclient.get_batch(batch.id)
    assert info is not None and info.state == "done" and set(info.callbacks) == {"finish"}
