"""The worker runtime: claim, run outside any transaction, renew, report."""

from leaseq.worker.config import WorkerConfig, default_worker_id
from leaseq.worker.context import JobContext, LeaseLost
from leaseq.worker.runner import Worker, WorkerStats, run_worker

__all__ = [
    "JobContext",
    "LeaseLost",
    "Worker",
    "WorkerConfig",
    "WorkerStats",
    "default_worker_id",
    "run_worker",
]
