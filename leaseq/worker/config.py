"""Worker settings, checked up front so nonsense fails at start with one clear line."""

from __future__ import annotations

import os
import secrets
import socket
from dataclasses import dataclass, field

from leaseq import validate
from leaseq.errors import ConfigError


def default_worker_id() -> str:
    """host:pid:random — unique per process start, readable in ``lease_owner``."""
    return f"{socket.gethostname()[:60]}:{os.getpid()}:{secrets.token_hex(3)}"


@dataclass(frozen=True)
class WorkerConfig:
    """How a worker claims and runs jobs.

    - ``lease_seconds``: length of each lease, renewed every ``heartbeat_interval``.
    - ``batch_size``: most jobs claimed in one statement (further bounded by free slots).
    - ``poll_interval``: the worker checks the table at least this often, NOTIFY or not.
    - ``sweep_interval``: how often this worker recovers expired leases (any worker may).
    - ``burst``: exit once nothing is claimable and nothing is running.
    - ``drain``: like burst, but also wait for scheduled retries of these queues.
    """

    queues: tuple[str, ...] = ("default",)
    concurrency: int = 10
    lease_seconds: float = 60.0
    heartbeat_interval: float | None = None
    batch_size: int = 100
    poll_interval: float = 2.0
    sweep_interval: float = 15.0
    shutdown_timeout: float = 30.0
    listen: bool = True
    burst: bool = False
    drain: bool = False
    worker_id: str = field(default_factory=default_worker_id)

    def __post_init__(self) -> None:
        if not self.queues:
            raise ConfigError("a worker needs at least one queue")
        for queue in self.queues:
            validate.check_name("queue", queue)
        if len(set(self.queues)) != len(self.queues):
            raise ConfigError(f"queue listed twice: {', '.join(self.queues)}")
        validate.check_int("concurrency", self.concurrency, 1, 10_000)
        validate.check_int("batch_size", self.batch_size, 1, validate.CLAIM_LIMIT_MAX)
        validate.check_positive_seconds("lease_seconds", self.lease_seconds)
        validate.check_positive_seconds("poll_interval", self.poll_interval, 3600)
        validate.check_positive_seconds("sweep_interval", self.sweep_interval, 3600)
        validate.check_positive_seconds("shutdown_timeout", self.shutdown_timeout, 86400)
        validate.check_worker_id(self.worker_id)
        if self.heartbeat_interval is not None:
            validate.check_positive_seconds("heartbeat_interval", self.heartbeat_interval)
            if self.heartbeat_interval >= self.lease_seconds:
                raise ConfigError(
                    f"heartbeat_interval ({self.heartbeat_interval:g}s) must be shorter than "
                    f"lease_seconds ({self.lease_seconds:g}s), or leases expire between renewals"
                )

    @property
    def renew_every(self) -> float:
        """Renew at a third of the lease, so two renewals can fail before it runs out."""
        return self.heartbeat_interval or self.lease_seconds / 3
