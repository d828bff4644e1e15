# Generated from leaseq/ops/trace_async.py by tools/gen_sync.py. Do not edit by hand:
# change the async source and run `python tools/gen_sync.py`.
"""The stored tracing context of jobs (``jobs.trace_context``), read before an attempt and
written after a failed one, for the tracing hooks of ``leaseq.tracing``. Unused without
hooks.

The synchronous twin of ``leaseq/ops/trace_async.py``; see that file for the logic.
"""

from __future__ import annotations

import json
from typing import Any

from leaseq.models import Lease
from leaseq.ops.base import ClientBase
from leaseq.tracing import Carrier


class TraceOps(ClientBase):
    def trace_context(self, job_id: int) -> dict[str, Any] | None:
        """The job's stored tracing context (None when it has none)."""
        rows = self._rows("job_trace_context", {"id": job_id})
        value = rows[0][0] if rows else None
        return value if isinstance(value, dict) else None

    def record_attempt_trace(self, lease: Lease, carrier: Carrier) -> None:
        """Remember a failed attempt's span for the next attempt to link to (fenced by
        the lease's owner and token: a later attempt's record is never overwritten)."""
        params = {
            "id": lease.job_id,
            "owner": lease.owner,
            "token": lease.token,
            "carrier": json.dumps(carrier),
        }
        self._rows("record_attempt_trace", params)
