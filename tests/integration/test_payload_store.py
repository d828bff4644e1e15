"""Large payloads kept out of the jobs table (docs/payloads.md), on a real PostgreSQL and a
local S3-compatible server: the job row keeps a marker, the worker gets the whole payload
(fetched once per attempt), retention and purge take the payload with the job, a
rolled-back enqueue leaves nothing in either store, and the orphan sweep removes what an
enqueue that died between its upload and its commit left behind."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

import leaseq
from leaseq import JobStatus, payload_store
from leaseq.codec import generate_key, is_sealed
from leaseq.payload_store import S3Store, is_offloaded
from tests.support.helpers import rows
from tests.support.s3 import new_bucket, object_keys, s3_server

BIG = {"doc": "x" * 5000}
SMALL = {"n": 1}
FAST = leaseq.RetryPolicy(base=0.001, cap=0.01)


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    with s3_server() as url:
        yield url


def _app(dsn: str, schema: str, store: S3Store | None = None, **options: Any) -> leaseq.App:
    app = leaseq.App(
        dsn, schema=schema, retry_policy=FAST, offload_above=1024, payload_store=store, **options
    )
    app.client.migrate()
    return app


def _drain(app: leaseq.App) -> None:
    config = leaseq.WorkerConfig(poll_interval=0.02, drain=True, concurrency=4)
    asyncio.run(leaseq.Worker(app, config).run())


def _stored(dsn: str, schema: str) -> list[tuple[Any, ...]]:
    return rows(dsn, "SELECT job_id, store, bytes FROM {s}.payloads ORDER BY job_id", schema)


@pytest.mark.parametrize("where", ["pg", "s3"])
def test_a_large_payload_leaves_a_marker_and_reaches_the_handler_whole(
    dsn: str, schema: str, s3_endpoint: str, where: str
) -> None:
    store = new_bucket(s3_endpoint) if where == "s3" else None
    app = _app(dsn, schema, store)
    seen: list[Any] = []
    app.task(name="t")(lambda ctx, payload: seen.append(payload))
    big = app.client.enqueue("t", BIG)
    small = app.client.enqueue("t", SMALL)
    many = app.client.enqueue_many([{"task": "t", "payload": BIG}] * 3)
    copied = app.client.enqueue_many([{"task": "t", "payload": BIG}] * 201)
    payloads = dict(rows(dsn, "SELECT id, payload FROM {s}.jobs", schema))
    assert is_offloaded(payloads[big]) and payloads[small] == SMALL
    assert all(is_offloaded(payloads[i]) for i in [*many, copied[0], copied[-1]])
    offloaded = _stored(dsn, schema)
    assert len(offloaded) == 1 + 3 + 201 and {r[1] for r in offloaded} == {where}
    if store is not None:
        assert len(object_keys(store)) == 205
    _drain(app)
    assert seen.count(BIG) == 205 and seen.count(SMALL) == 1


@pytest.mark.parametrize("where", ["pg", "s3"])
def test_retention_and_purge_take_the_payload_with_the_job(
    dsn: str, schema: str, s3_endpoint: str, where: str
) -> None:
    store = new_bucket(s3_endpoint) if where == "s3" else None
    app = _app(dsn, schema, store)
    app.task(name="ok")(lambda ctx, payload: None)

    @app.task(name="bad", max_attempts=1)
    def bad(ctx: leaseq.JobContext, payload: Any) -> None:
        raise leaseq.Permanent("NO", "refused")

    app.client.enqueue("ok", BIG)
    dead = app.client.enqueue("bad", BIG)
    _drain(app)
    rows(dsn, "UPDATE {s}.jobs SET finished_at = now() - interval '1 hour' RETURNING 1", schema)
    assert app.client.prune(older_than=60) == 1
    assert app.client.purge_dead(reason="done with it", actor="test") == 1
    assert app.client.get_job(dead) is None
    assert _stored(dsn, schema) == []
    if store is not None:
        queued = rows(dsn, "SELECT count(*) FROM {s}.payload_deletes", schema)
        assert queued == [(2,)]
        assert app.client.delete_payload_objects() == 2
        assert object_keys(store) == set()
        assert rows(dsn, "SELECT count(*) FROM {s}.payload_deletes", schema) == [(0,)]


@pytest.mark.parametrize("where", ["pg", "s3"])
def test_a_rolled_back_enqueue_leaves_nothing_in_either_store(
    dsn: str, schema: str, s3_endpoint: str, where: str
) -> None:
    store = new_bucket(s3_endpoint) if where == "s3" else None
    app = _app(dsn, schema, store)
    # The enqueue's own transaction fails (an unknown dependency): the upload goes too.
    with pytest.raises(leaseq.ConfigError):
        app.client.enqueue("t", BIG, depends_on=[10**12])
    # The caller's transaction rolls back after the enqueue returned.
    with psycopg.connect(dsn) as conn:
        app.client.enqueue("t", BIG, connection=conn)
        conn.rollback()
    assert rows(dsn, "SELECT count(*) FROM {s}.jobs", schema) == [(0,)]
    assert _stored(dsn, schema) == []
    if store is not None:
        assert len(object_keys(store)) == 1  # the caller's rollback came after the upload
        assert app.client.sweep_orphan_payloads(grace=0) == 1
        assert object_keys(store) == set()


def test_a_missing_payload_ends_the_job_dead_with_the_reason(dsn: str, schema: str) -> None:
    app = _app(dsn, schema)
    app.task(name="t")(lambda ctx, payload: None)
    job = app.client.enqueue("t", BIG)
    rows(dsn, "DELETE FROM {s}.payloads RETURNING 1", schema)
    _drain(app)
    found = app.client.get_job(job)
    assert found is not None and found.status is JobStatus.DEAD
    assert found.last_error_code == "PAYLOAD_MISSING"


def test_a_replace_updates_the_offloaded_payload_and_an_object_it_replaced_goes(
    dsn: str, schema: str, s3_endpoint: str
) -> None:
    store = new_bucket(s3_endpoint)
    app = _app(dsn, schema, store)
    seen: list[Any] = []
    app.task(name="t")(lambda ctx, payload: seen.append(payload))
    first = app.client.enqueue("t", BIG, unique_key="k", on_conflict="replace")
    second = app.client.enqueue("t", {"doc": "y" * 5000}, unique_key="k", on_conflict="replace")
    assert int(second) == int(first) and second.replaced
    assert len(_stored(dsn, schema)) == 1
    skipped = app.client.enqueue("t", BIG, unique_key="k")  # on_conflict skip: nothing kept
    assert not skipped.inserted
    assert app.client.delete_payload_objects() == 1  # the replaced payload's object
    assert len(object_keys(store)) == 1
    app.client.enqueue("t", SMALL, unique_key="k", on_conflict="replace")  # inline again
    assert _stored(dsn, schema) == []
    _drain(app)
    assert seen == [SMALL]
    assert app.client.delete_payload_objects() == 1 and object_keys(store) == set()


def test_an_offloaded_payload_is_sealed_in_its_store_and_rotated_there(
    dsn: str, schema: str, s3_endpoint: str
) -> None:
    old, new = generate_key(), generate_key()
    store = new_bucket(s3_endpoint)
    app = _app(dsn, schema, store, encryption_keys=[old])
    app.task(name="t", encrypt=True)(lambda ctx, payload: None)
    app.client.enqueue("t", BIG)
    (key,) = object_keys(store)
    body = store.get(key)
    assert body is not None and b"xxxx" not in body and is_sealed(__import__("json").loads(body))
    rotated = _app(dsn, schema, store, encryption_keys=[new, old])
    seen: list[Any] = []
    rotated.task(name="t", encrypt=True)(lambda ctx, payload: seen.append(payload))
    done = rotated.client.rotate_keys()
    assert done.rotated["payloads"] == 1 and sum(done.left.values()) == 0
    only_new = _app(dsn, schema, store, encryption_keys=[new])
    only_new.task(name="t", encrypt=True)(lambda ctx, payload: seen.append(payload))
    _drain(only_new)
    assert seen == [BIG]


def test_offload_settings_are_checked_in_one_line(dsn: str) -> None:
    with pytest.raises(leaseq.ConfigError, match="at least 256 bytes"):
        leaseq.App(dsn, offload_above=10)
    with pytest.raises(leaseq.ConfigError, match="needs offload_above"):
        leaseq.App(dsn, payload_store=S3Store("b"))


@pytest.mark.parametrize("how", ["async, two connections", "sync, in a transaction"])
def test_a_claim_reads_its_payloads_in_parts_and_ends_only_the_bad_ones(
    dsn: str, schema: str, how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A claim's offloaded payloads are read in parts (here about two payloads each): by
    the async client on two pooled connections at once, by a claim in the caller's
    transaction one part after the other. Every payload arrives whole and with its own
    job; one gone from the store ends dead (PAYLOAD_MISSING), one whose stored text does
    not decode too (INVALID_PAYLOAD), and the others are claimed."""
    monkeypatch.setattr(payload_store, "FETCH_PART_BYTES", 2 * len(json.dumps(BIG)) + 200)
    app = _app(dsn, schema)
    docs = [{**BIG, "i": i} for i in range(11)]
    ids = app.client.enqueue_many([{"task": "t", "payload": d} for d in docs])
    gone, broken = ids[3], ids[6]
    rows(dsn, f"DELETE FROM {{s}}.payloads WHERE job_id = {gone} RETURNING 1", schema)
    rows(
        dsn, f"UPDATE {{s}}.payloads SET data = 'nope' WHERE job_id = {broken} RETURNING 1", schema
    )
    if how.startswith("async"):

        async def claim() -> list[leaseq.Lease]:
            async with leaseq.AsyncClient(dsn, schema=schema) as client:
                return await client.claim(worker="w", limit=20)

        leases = asyncio.run(claim())
    else:
        with psycopg.connect(dsn) as conn:
            leases = app.client.claim(worker="w", limit=20, connection=conn)
            conn.commit()
    assert {x.job_id: x.payload for x in leases} == {
        i: d for i, d in zip(ids, docs, strict=True) if i not in (gone, broken)
    }
    for job, code in ((gone, "PAYLOAD_MISSING"), (broken, "INVALID_PAYLOAD")):
        found = app.client.get_job(job)
        assert found is not None and found.status is JobStatus.DEAD
        assert found.last_error_code == code
