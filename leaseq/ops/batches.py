# Generated from leaseq/ops/batches_async.py by tools/gen_sync.py. Do not edit by hand:
# change the async source and run `python tools/gen_sync.py`.
"""Batches and workflows: ``batch()`` groups jobs and enqueues its callbacks exactly once
when it is sealed and all its jobs have ended (fired in base_async, in the transaction of
the transition that ended the last job, or at the seal); ``enqueue_flow`` stores a chain or
group (``leaseq.workflows``) in one ``enqueue_many``.

The synchronous twin of ``leaseq/ops/batches_async.py``; see that file for the logic.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from leaseq import validate
from leaseq.jobspec import JobSpec
from leaseq.models import BatchInfo
from leaseq.ops.enqueue import EnqueueOps
from leaseq.rules.unique import EnqueueResult
from leaseq.workflows import Flow, Sig, callback_spec, flow_items


class Batch:
    """An open batch: jobs enqueued through it join it until :meth:`seal`."""

    def __init__(self, client: BatchOps, batch_id: int) -> None:
        self.client = client
        self.id = batch_id

    def enqueue(self, task: str, payload: Any = None, **options: Any) -> EnqueueResult:
        """``enqueue`` into this batch (the batch must still be open)."""
        return self.client.enqueue(task, payload, batch_id=self.id, **options)

    def enqueue_many(self, jobs: Iterable[JobSpec | Mapping[str, Any]]) -> list[EnqueueResult]:
        items = [dict(vars(j)) if isinstance(j, JobSpec) else dict(j) for j in jobs]
        return self.client.enqueue_many([{**j, "batch_id": self.id} for j in items])

    def enqueue_flow(self, flow: Flow) -> list[EnqueueResult]:
        """A chain or group whose jobs all join this batch."""
        return self.enqueue_many(flow_items(flow))

    def seal(self) -> bool:
        """No more jobs; the callbacks fire once every job has ended (at once if they
        already have). False when it was sealed before."""
        return self.client.seal_batch(self.id)


class BatchOps(EnqueueOps):
    def create_batch(
        self,
        *,
        on_success: Sig | None = None,
        on_failure: Sig | None = None,
        on_finish: Sig | None = None,
    ) -> int:
        """A new open batch; returns its id. Callbacks are signatures (``task.sig(...)``):
        ``on_success`` when every job succeeded, ``on_failure`` when any ended dead or
        cancelled, ``on_finish`` always; each receives {"batch_id", "kind", "total",
        "succeeded", "dead", "cancelled", "payload"} (payload: the signature's own)."""
        params = {
            kind: None if spec is None else validate.encode_payload(self._sealed_spec(spec))
            for kind, spec in (
                ("on_success", callback_spec(on_success)),
                ("on_failure", callback_spec(on_failure)),
                ("on_finish", callback_spec(on_finish)),
            )
        }
        return int((self._rows("create_batch", params))[0][0])

    def _sealed_spec(self, spec: dict[str, Any]) -> dict[str, Any]:
        """A callback's payload sealed when its task encrypts: the database puts it, as
        stored, into the callback job's payload when the batch fires (the claim opens it)."""
        if self.encryption is None or not self.encryption.applies(spec["task"]):
            return spec
        text = validate.encode_payload(spec["payload"], self.payload_limit)
        return {**spec, "payload": json.loads(self.encryption.keyring.seal(text, "payload"))}

    def seal_batch(self, batch_id: int) -> bool:
        """Close the batch to new jobs and fire it if its jobs have all ended."""
        with self._transaction() as conn:
            if not self._rows("seal_batch", {"id": batch_id}, conn):
                return False
            self._fire_batches(conn, [batch_id])
        return True

    @contextlib.contextmanager
    def batch(
        self,
        *,
        on_success: Sig | None = None,
        on_failure: Sig | None = None,
        on_finish: Sig | None = None,
    ) -> Iterator[Batch]:
        """``with client.batch(on_success=report.sig(...)) as b: b.enqueue(...)``: sealed
        when the block ends normally. A block that raises leaves the batch open: it never
        fires (seal it yourself if the jobs already enqueued should count)."""
        handle = Batch(
            self,
            self.create_batch(on_success=on_success, on_failure=on_failure, on_finish=on_finish),
        )
        yield handle
        handle.seal()

    def get_batch(self, batch_id: int) -> BatchInfo | None:
        """A batch's state, callbacks, its jobs' counts by status and the callback jobs."""
        rows = self._read("get_batch", {"id": batch_id})
        return BatchInfo(*rows[0]) if rows else None

    def enqueue_flow(self, flow: Flow) -> list[EnqueueResult]:
        """Store a chain or group (``leaseq.chain``, ``leaseq.group``) in one transaction;
        returns the ids of its jobs in flow order (depth first)."""
        return self.enqueue_many(flow_items(flow))
