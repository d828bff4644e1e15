"""The workflow commands as an operator runs them: `jobs show` with dependencies and
batch, `waiting`, `batches show`, `replay --with-dependents`; errors are one line."""

from __future__ import annotations

import json

import leaseq
from tests.acceptance.test_cli import run


def test_jobs_show_waiting_and_replay_with_dependents(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    parent = client.enqueue("t", max_attempts=1)
    child = client.enqueue("t", depends_on=[parent])
    out = run(dsn, schema, "waiting").stdout
    assert str(child) in out and str(parent) in out
    shown = json.loads(run(dsn, schema, "jobs", "show", str(child), "--json").stdout)
    assert shown["depends_on"] == [
        {"job_id": parent, "on_dead": "cancel", "status": "pending", "waiting": False}
    ]
    assert (
        f"dependents           {child} (waiting)"
        in run(dsn, schema, "jobs", "show", str(parent)).stdout
    )
    (lease,) = client.claim(worker="w")
    client.fail(lease, "BOOM", retryable=False)
    assert client.get_job(child).status is leaseq.JobStatus.CANCELLED  # type: ignore[union-attr]
    run(dsn, schema, "replay", str(parent), "--reason", "fixed", "--with-dependents")
    assert client.get_job(child).status is leaseq.JobStatus.PENDING  # type: ignore[union-attr]
    assert "waiting" in run(dsn, schema, "jobs", "show", str(parent)).stdout


def test_batches_show(dsn: str, schema: str, client: leaseq.Client) -> None:
    batch_id = client.create_batch(on_finish=leaseq.Sig("done"))
    job = client.enqueue("t", batch_id=batch_id)
    out = run(dsn, schema, "batches", "show", str(batch_id)).stdout
    assert "open" in out and "on_finish: done (not fired)" in out
    assert f"batch                {batch_id}" in run(dsn, schema, "jobs", "show", str(job)).stdout
    client.seal_batch(batch_id)
    (lease,) = client.claim(worker="w")
    client.complete(lease)
    info = json.loads(run(dsn, schema, "batches", "show", str(batch_id), "--json").stdout)
    assert info["state"] == "done" and info["counts"] == {"succeeded": 1}
    failed = run(dsn, schema, "batches", "show", "999999", ok=False)
    assert failed.returncode == 1 and failed.stderr.strip().count("\n") == 0
