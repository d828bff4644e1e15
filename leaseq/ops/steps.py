# Generated from leaseq/ops/steps_async.py by tools/gen_sync.py. Do not edit by hand:
# change the async source and run `python tools/gen_sync.py`.
"""Durable steps' records (``ctx.step``, leaseq.worker.steps): read a job's records, and
write one more under the fence, in the caller's transaction when it gives one (the step's
own database work commits with its record, or not at all).

The synchronous twin of ``leaseq/ops/steps_async.py``; see that file for the logic.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from psycopg import Connection

from leaseq import validate
from leaseq.models import Lease, StepRecord
from leaseq.ops.payloads import PayloadOps


class StepOps(PayloadOps):
    def step_records(
        self, job_id: int, *, connection: Connection[Any] | None = None
    ) -> list[StepRecord]:
        """A job's step records in their order, results opened (on the primary: an attempt
        must see every step an earlier one committed)."""
        rows = self._rows("step_records", {"id": job_id}, connection)
        records = [StepRecord(*row) for row in rows]
        return [dataclasses.replace(r, result=self._open(r.result, "effect")) for r in records]

    def job_steps(self, job_id: int) -> list[StepRecord]:
        """A job's step records for inspection (results as stored: sealed ones stay so)."""
        return [StepRecord(*row) for row in self._read("job_steps", {"id": job_id})]

    def step_record(
        self,
        lease: Lease,
        name: str,
        seq: int,
        result: Any,
        *,
        connection: Connection[Any] | None = None,
    ) -> bool:
        """Record a finished step under the fence; False means nothing was recorded: the
        lease is lost, or a record of this name or place already committed. With
        ``connection`` the record joins that connection's transaction."""
        self._refuse_isolation(connection)
        text = validate.encode_payload(result, self.payload_limit)
        params = {
            "id": lease.job_id,
            "owner": lease.owner,
            "token": lease.token,
            "attempt": lease.attempt,
            "name": name,
            "seq": seq,
            # Sealed as an effect record: a step is one, recorded by the worker itself.
            "result": self._seal_value(lease.task, text, "effect"),
        }
        return bool(self._rows("step_record", params, connection))
