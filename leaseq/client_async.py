"""AsyncClient: enqueue, claim and every fenced transition, over a psycopg connection pool.

The client is its groups of operations combined (``leaseq.ops``: enqueue, the lease
protocol, failures and the sweep, inspection, operator actions, pauses, schedules, limits,
stored results, tracing contexts, the dashboard's reads, step records,
the HTTP API's tokens) over one base that
owns the pool.
``leaseq/client.py`` (the sync ``Client``) is generated from this file, and each
``leaseq/ops/*_async.py`` to its sync twin, by ``tools/gen_sync.py``; a test fails when
they disagree.
"""

from __future__ import annotations

from leaseq.jobspec import COPY_THRESHOLD
from leaseq.ops.admin_async import AsyncAdminOps
from leaseq.ops.batches_async import AsyncBatchOps
from leaseq.ops.enqueue_async import AsyncEnqueueOps
from leaseq.ops.failure_async import AsyncFailureOps
from leaseq.ops.fair_async import AsyncFairOps
from leaseq.ops.inspect_async import AsyncInspectOps
from leaseq.ops.lease_async import AsyncLeaseOps
from leaseq.ops.limits_async import AsyncLimitOps
from leaseq.ops.pauses_async import AsyncPauseOps
from leaseq.ops.results_async import AsyncResultOps
from leaseq.ops.schedules_async import AsyncScheduleOps
from leaseq.ops.steps_async import AsyncStepOps
from leaseq.ops.tokens_async import AsyncTokenOps
from leaseq.ops.trace_async import AsyncTraceOps
from leaseq.ops.web_async import AsyncWebOps
from leaseq.params import notify_channel

__all__ = ["COPY_THRESHOLD", "AsyncClient", "notify_channel"]


class AsyncClient(
    AsyncBatchOps,
    AsyncEnqueueOps,
    AsyncLeaseOps,
    AsyncFailureOps,
    AsyncInspectOps,
    AsyncAdminOps,
    AsyncPauseOps,
    AsyncResultOps,
    AsyncScheduleOps,
    AsyncTraceOps,
    AsyncWebOps,
    AsyncLimitOps,
    AsyncFairOps,
    AsyncStepOps,
    AsyncTokenOps,
):
    """Talks to one leaseq schema. Cheap to create; connects on first use.

    ``dsn`` falls back to ``LEASEQ_DSN`` and then to the embedded PostgreSQL.
    ``read_dsn``: a read replica for the inspection reads (docs/scaling.md).
    """
