"""leaseq: a PostgreSQL job queue with fenced, expiring leases.

Workers claim jobs with one short ``FOR UPDATE SKIP LOCKED`` statement, commit, then run
them outside any transaction under a lease measured in database time. Every claim bumps a
fencing token that every later write must present, so a worker whose lease expired can
never overwrite the job's state.
"""

from leaseq.app import App, Task
from leaseq.client import Client
from leaseq.client_async import AsyncClient
from leaseq.codec import Encryption
from leaseq.errors import (
    ConfigError,
    DatabaseUnavailable,
    EmbeddedError,
    InvalidTransition,
    IsolationLevelError,
    JobCancelled,
    JobDead,
    JobFailed,
    JobNotFound,
    LeaseqError,
    PayloadError,
    Permanent,
    ReplayRefused,
    ResultTimeout,
    Retry,
    SchemaError,
    UniqueConflict,
)
from leaseq.jobspec import EnqueueOptions, JobSpec
from leaseq.models import (
    Dependency,
    EffectRecord,
    Failure,
    Heartbeat,
    Job,
    JobEvent,
    JobResult,
    Lease,
    QueueScaling,
    QueueStats,
    SweepResult,
)
from leaseq.payload_store import S3Store
from leaseq.retry import RetryPolicy
from leaseq.routed import RoutedBatch, RoutedClient
from leaseq.routed_async import AsyncRoutedBatch, AsyncRoutedClient
from leaseq.rules.deps import Dep, Ref
from leaseq.rules.limits import Limit, RateLimit
from leaseq.rules.pauses import AdminEvent, Pause
from leaseq.rules.replicas import ReplicaLag
from leaseq.rules.routing import QueueMap, RoutedResult
from leaseq.rules.schedules import Schedule, ScheduleTick
from leaseq.rules.unique import EnqueueResult, ReplayResult
from leaseq.states import JobStatus
from leaseq.worker import (
    ChildFailed,
    EffectDecision,
    EffectNotPerformed,
    FencedTransaction,
    JobAborted,
    JobContext,
    JobSuspended,
    LeaseLost,
    QueueSettings,
    StepError,
    UncertainEffect,
    WaitTimeout,
    Worker,
    WorkerConfig,
    WorkerStats,
    run_worker,
)
from leaseq.workflows import Chain, Group, Sig, chain, group

__version__ = "0.1.0"

__all__ = [
    "AdminEvent",
    "App",
    "AsyncClient",
    "AsyncRoutedBatch",
    "AsyncRoutedClient",
    "Chain",
    "ChildFailed",
    "Client",
    "ConfigError",
    "DatabaseUnavailable",
    "Dep",
    "Dependency",
    "EffectDecision",
    "EffectNotPerformed",
    "EffectRecord",
    "EmbeddedError",
    "Encryption",
    "EnqueueOptions",
    "EnqueueResult",
    "Failure",
    "FencedTransaction",
    "Group",
    "Heartbeat",
    "InvalidTransition",
    "IsolationLevelError",
    "Job",
    "JobAborted",
    "JobCancelled",
    "JobContext",
    "JobDead",
    "JobEvent",
    "JobFailed",
    "JobNotFound",
    "JobResult",
    "JobSpec",
    "JobStatus",
    "JobSuspended",
    "Lease",
    "LeaseLost",
    "LeaseqError",
    "Limit",
    "Pause",
    "PayloadError",
    "Permanent",
    "QueueMap",
    "QueueScaling",
    "QueueSettings",
    "QueueStats",
    "RateLimit",
    "Ref",
    "ReplayRefused",
    "ReplayResult",
    "ReplicaLag",
    "ResultTimeout",
    "Retry",
    "RetryPolicy",
    "RoutedBatch",
    "RoutedClient",
    "RoutedResult",
    "S3Store",
    "Schedule",
    "ScheduleTick",
    "SchemaError",
    "Sig",
    "StepError",
    "SweepResult",
    "Task",
    "UncertainEffect",
    "UniqueConflict",
    "WaitTimeout",
    "Worker",
    "WorkerConfig",
    "WorkerStats",
    "__version__",
    "chain",
    "group",
    "run_worker",
]
