"""An app whose payloads are offloaded to S3 (`tests.support.apps.payloads:app`), for the
payload store's crash tests: the bucket and endpoint come from the environment
(LEASEQ_TEST_S3_ENDPOINT, LEASEQ_TEST_S3_BUCKET); ``python -m tests.support.apps.payloads``
enqueues offloaded jobs until it is killed."""

from __future__ import annotations

import os
from typing import Any

import leaseq
from tests.support.s3 import CREDENTIALS

store = leaseq.S3Store(
    os.environ.get("LEASEQ_TEST_S3_BUCKET", "unset"),
    endpoint_url=os.environ.get("LEASEQ_TEST_S3_ENDPOINT"),
    region_name="us-east-1",
    **CREDENTIALS,
)
app = leaseq.App(
    schema=os.environ.get("LEASEQ_SCHEMA", "leaseq"),  # the CLI's --schema wins for a worker
    retry_policy=leaseq.RetryPolicy(base=0.01, cap=0.05),
    offload_above=1024,
    payload_store=store,
)


@app.task(name="big")
def big(ctx: leaseq.JobContext, payload: Any) -> None:
    assert len(payload["doc"]) == 4000


if __name__ == "__main__":
    print("enqueuing", flush=True)
    n = 0
    while True:  # until killed: some enqueues die between their upload and their commit
        big.enqueue({"doc": "x" * 4000, "n": n})
        app.client.enqueue_many([{"task": "big", "payload": {"doc": "y" * 4000}}] * 5)
        n += 1
