"""A local S3-compatible server for the payload store's tests: moto's standalone server, a
real HTTP server speaking the S3 API, in a process of its own on a free port."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator

from leaseq.payload_store import S3Store
from tests.support.ports import free_port

CREDENTIALS = {"aws_access_key_id": "test", "aws_secret_access_key": "test"}


@contextlib.contextmanager
def s3_server() -> Iterator[str]:
    """Start the server; yields its endpoint URL; stops it afterwards."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "MOTO_ALLOW_NONEXISTENT_REGION": "true"},
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(url, timeout=1).close()
                break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the S3 server did not start") from None
                time.sleep(0.1)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()


def new_bucket(endpoint: str) -> S3Store:
    """A store on a bucket of its own."""
    store = S3Store(
        f"b-{uuid.uuid4().hex[:12]}", endpoint_url=endpoint, region_name="us-east-1", **CREDENTIALS
    )
    store.client().create_bucket(Bucket=store.bucket)
    return store


def object_keys(store: S3Store) -> set[str]:
    found = store.client().list_objects_v2(Bucket=store.bucket)
    return {item["Key"] for item in found.get("Contents", [])}
