"""Crashes at the payload store's boundaries (docs/payloads.md), with real processes and a
local S3-compatible server: kill -9 of a process in the middle of offloaded enqueues (an
upload with no commit behind it), and of a worker in the middle of retention (rows gone,
objects not yet): after the orphan sweep and the upkeep, every object is some job's payload
and every payload row has its job, and every job enqueued runs with its whole payload."""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

import leaseq
from tests.support.helpers import rows
from tests.support.s3 import new_bucket, object_keys, s3_server

ROOT = pathlib.Path(__file__).resolve().parents[2]
APP = "tests.support.apps.payloads:app"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    with s3_server() as url:
        yield url


def _env(dsn: str, schema: str, endpoint: str, bucket: str) -> dict[str, str]:
    return dict(
        os.environ,
        LEASEQ_DSN=dsn,
        LEASEQ_SCHEMA=schema,
        PYTHONPATH=str(ROOT),
        LEASEQ_TEST_S3_ENDPOINT=endpoint,
        LEASEQ_TEST_S3_BUCKET=bucket,
    )


def _consistent(client: leaseq.Client, dsn: str, schema: str, store: leaseq.S3Store) -> None:
    """Every object is a payload row's, every row has its job, nothing waits to be deleted."""
    keys = {r[0] for r in rows(dsn, "SELECT object_key FROM {s}.payloads", schema)}
    assert object_keys(store) == keys
    orphans = rows(
        dsn,
        "SELECT count(*) FROM {s}.payloads p WHERE NOT EXISTS"
        " (SELECT 1 FROM {s}.jobs j WHERE j.id = p.job_id)",
        schema,
    )
    assert orphans == [(0,)]
    assert rows(dsn, "SELECT count(*) FROM {s}.payload_deletes", schema) == [(0,)]


def test_kill_9_during_offloaded_enqueues_leaves_no_orphan_after_the_sweep(
    dsn: str, schema: str, client: leaseq.Client, s3_endpoint: str
) -> None:
    store = new_bucket(s3_endpoint)
    env = _env(dsn, schema, s3_endpoint, store.bucket)
    producer = subprocess.Popen(
        [sys.executable, "-m", "tests.support.apps.payloads"],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert producer.stdout is not None and producer.stdout.readline() == "enqueuing\n"
        deadline = time.monotonic() + 30
        while rows(dsn, "SELECT count(*) FROM {s}.jobs", schema)[0][0] < 60:
            assert time.monotonic() < deadline, "the producer enqueued nothing"
            time.sleep(0.05)
        os.kill(producer.pid, signal.SIGKILL)
        producer.wait(10)
    finally:
        if producer.poll() is None:
            producer.kill()
    enqueued = rows(dsn, "SELECT count(*) FROM {s}.jobs", schema)[0][0]
    app = leaseq.App(dsn, schema=schema, offload_above=1024, payload_store=store)
    app.client.sweep_orphan_payloads(grace=0)
    _consistent(client, dsn, schema, store)
    # Every job that committed runs with its whole payload.
    drained = subprocess.run(
        [sys.executable, "-m", "leaseq", "worker", APP, "--burst", "--concurrency", "8"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert drained.returncode == 0, drained.stderr
    done = rows(dsn, "SELECT count(*) FROM {s}.jobs WHERE status = 'succeeded'", schema)
    assert done == [(enqueued,)]


def test_kill_9_of_a_worker_during_retention_leaves_no_orphan_after_the_upkeep(
    dsn: str, schema: str, client: leaseq.Client, s3_endpoint: str
) -> None:
    store = new_bucket(s3_endpoint)
    app = leaseq.App(dsn, schema=schema, offload_above=1024, payload_store=store)
    app.client.enqueue_many([{"task": "big", "payload": {"doc": "x" * 4000}}] * 300)
    for lease in app.client.claim("default", worker="w", limit=300, lease_seconds=60):
        app.client.complete(lease)
    rows(dsn, "UPDATE {s}.jobs SET finished_at = now() - interval '1 hour' RETURNING 1", schema)
    env = _env(dsn, schema, s3_endpoint, store.bucket)
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "leaseq",
            "worker",
            APP,
            "--retention",
            "60",
            "--prune-interval",
            "0.1",
            "--sweep-interval",
            "0.1",
        ],
        env=env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        # Kill it once retention has begun: some rows gone, objects of some still there.
        while rows(dsn, "SELECT count(*) FROM {s}.jobs", schema)[0][0] == 300:
            assert time.monotonic() < deadline, "the worker never pruned"
            time.sleep(0.02)
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait(10)
    finally:
        if worker.poll() is None:
            worker.kill()
    # A later worker's upkeep (here, its calls) finishes what the dead one left.
    assert app.client.prune(older_than=60) >= 0
    while app.client.delete_payload_objects():
        pass
    assert rows(dsn, "SELECT count(*) FROM {s}.jobs", schema) == [(0,)]
    _consistent(client, dsn, schema, store)
    assert object_keys(store) == set()
