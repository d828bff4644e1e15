"""The worker runtime: claim, run outside any transaction, renew, report."""

from leaseq.worker.config import QueueSettings, WorkerConfig, default_worker_id
from leaseq.worker.context import JobAborted, JobContext, LeaseLost
from leaseq.worker.effects import (
    EffectDecision,
    EffectNotPerformed,
    FencedTransaction,
    UncertainEffect,
)
from leaseq.worker.runner import Worker, WorkerStats, run_worker

__all__ = [
    "EffectDecision",
    "EffectNotPerformed",
    "FencedTransaction",
    "JobAborted",
    "JobContext",
    "LeaseLost",
    "QueueSettings",
    "UncertainEffect",
    "Worker",
    "WorkerConfig",
    "WorkerStats",
    "default_worker_id",
    "run_worker",
]
