"""The worker runtime: claim, run outside any transaction, renew, report."""

from leaseq.worker.aborts import JobSuspended
from leaseq.worker.config import QueueSettings, WorkerConfig, default_worker_id
from leaseq.worker.context import JobAborted, JobContext, LeaseLost
from leaseq.worker.effects import (
    EffectDecision,
    EffectNotPerformed,
    FencedTransaction,
    UncertainEffect,
)
from leaseq.worker.runner import Worker, WorkerStats, run_worker
from leaseq.worker.spawns import ChildFailed
from leaseq.worker.steps import StepError
from leaseq.worker.waits import WaitTimeout

__all__ = [
    "ChildFailed",
    "EffectDecision",
    "EffectNotPerformed",
    "FencedTransaction",
    "JobAborted",
    "JobContext",
    "JobSuspended",
    "LeaseLost",
    "QueueSettings",
    "StepError",
    "UncertainEffect",
    "WaitTimeout",
    "Worker",
    "WorkerConfig",
    "WorkerStats",
    "default_worker_id",
    "run_worker",
]
