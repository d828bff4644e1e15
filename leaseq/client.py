# Generated from leaseq/client_async.py by tools/gen_sync.py. Do not edit by hand:
# change the async source and run `python tools/gen_sync.py`.
"""Client: enqueue, claim and every fenced transition, over a psycopg connection pool.

The synchronous twin of ``leaseq/client_async.py``; see that file for the logic.
"""

from __future__ import annotations

from leaseq.jobspec import COPY_THRESHOLD
from leaseq.ops.admin import AdminOps
from leaseq.ops.batches import BatchOps
from leaseq.ops.enqueue import EnqueueOps
from leaseq.ops.failure import FailureOps
from leaseq.ops.fair import FairOps
from leaseq.ops.inspect import InspectOps
from leaseq.ops.lease import LeaseOps
from leaseq.ops.limits import LimitOps
from leaseq.ops.pauses import PauseOps
from leaseq.ops.results import ResultOps
from leaseq.ops.schedules import ScheduleOps
from leaseq.ops.steps import StepOps
from leaseq.ops.tokens import TokenOps
from leaseq.ops.trace import TraceOps
from leaseq.ops.web import WebOps
from leaseq.params import notify_channel

__all__ = ["COPY_THRESHOLD", "Client", "notify_channel"]


class Client(
    BatchOps,
    EnqueueOps,
    LeaseOps,
    FailureOps,
    InspectOps,
    AdminOps,
    PauseOps,
    ResultOps,
    ScheduleOps,
    TraceOps,
    WebOps,
    LimitOps,
    FairOps,
    StepOps,
    TokenOps,
):
    """Talks to one leaseq schema. Cheap to create; connects on first use.

    ``dsn`` falls back to ``LEASEQ_DSN`` and then to the embedded PostgreSQL.
    ``read_dsn``: a read replica for the inspection reads (docs/scaling.md).
    """
