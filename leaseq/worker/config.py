"""Worker settings, checked up front so nonsense fails at start with one clear line.

Each :class:`WorkerConfig` field also carries its command-line help (``field(metadata=...)``):
``leaseq worker`` builds its options from these fields."""

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
class QueueSettings:
    """One queue a worker serves, with optional overrides of the worker-wide settings."""

    name: str
    lease_seconds: float | None = None
    batch_size: int | None = None
    #: Share of the slots when a worker serves several queues that all have work.
    weight: int = 1

    def __post_init__(self) -> None:
        validate.check_name("queue", self.name)
        validate.check_int("queue weight", self.weight, 1, 1000)
        if self.lease_seconds is not None:
            validate.check_positive_seconds("lease_seconds", self.lease_seconds)
        if self.batch_size is not None:
            validate.check_int("batch_size", self.batch_size, 1, validate.CLAIM_LIMIT_MAX)

    @classmethod
    def parse(cls, text: str) -> QueueSettings:
        """``NAME[=WEIGHT][:lease=SECONDS,batch=N]`` (the CLI's ``--queue`` syntax)."""
        head, _, options = text.partition(":")
        name, eq, weight_text = head.partition("=")
        weight = 1
        if eq:
            try:
                weight = int(weight_text)
            except ValueError:
                raise ConfigError(f"bad queue weight in {text!r}: use NAME=WEIGHT") from None
        values: dict[str, str] = {}
        for item in filter(None, options.split(",")):
            key, eq, value = item.partition("=")
            if not eq or key not in ("lease", "batch") or key in values:
                raise ConfigError(
                    f"bad queue option {item!r} in {text!r}: use NAME:lease=SECONDS,batch=N"
                )
            values[key] = value
        try:
            lease = float(values["lease"]) if "lease" in values else None
            batch = int(values["batch"]) if "batch" in values else None
        except ValueError:
            raise ConfigError(f"bad number in queue option {text!r}") from None
        return cls(name, lease, batch, weight)


def _cli(
    help: str, *, short: str | None = None, kind: str = "", option: bool = True
) -> dict[str, object]:
    """What ``leaseq worker`` makes of a setting: its ``--help`` text, a short flag, and a
    kind when the type alone does not say it (``duration``, ``duration_or_never``,
    ``negated_flag``: a ``--no-NAME`` flag that sets False). The CLI builds its options
    from these fields, so names, types and defaults are declared only here."""
    return {"help": help, "short": short, "kind": kind, "option": option}


@dataclass(frozen=True)
class WorkerConfig:
    """How a worker claims and runs jobs.

    - ``queues``: names or :class:`QueueSettings`; claimed from in turn.
    - ``concurrency``: handlers running at once (slots).
    - ``prefetch``: leases claimed beyond free slots, waiting to start. They hold jobs other
      workers could run, so keep it small; unstarted leases are released (no attempt
      charged) at shutdown.
    - ``lease_seconds``: lease length (per queue overridable); renewed every third of it.
    - ``batch_size``: most jobs claimed in one statement (further bounded by free slots).
    - ``adaptive_batch``: size claims by their measured round trip instead: each claim's size
      and time feed a fit of its fixed and per-job cost, and claims ask for the size at which
      the fixed part is a tenth of the claim (up to the claim limit, 1,000); up to that many
      leases are then held beyond the slots (at most ``concurrency``). A queue's own
      ``batch=N`` stays fixed. See ``leaseq.rules.batching``.
    - ``claims_in_flight``: while the queues are busy (a claim came back full), up to this
      many claim statements run at once; one at a time caps a worker at one batch per
      round trip. An idle worker polls with one.
    - ``poll_interval``: the worker checks the table at least this often, NOTIFY or not.
    - ``sweep_interval``: how often this worker recovers expired leases (any worker may).
    - ``stop_grace``: a sync handler the worker stopped (``max_runtime``, ``NO_PROGRESS``,
      a cancel, a lost lease, shutdown) gets an exception raised in its thread (the soft
      stop); one still running this many seconds later ends the whole process (the hard
      stop, exit code 4) for its supervisor to replace. The grace counts again from the end
      of a database outage (a handler may be waiting for a connection, bounded by the
      pool's 30 s). None: never (its thread runs on, its lease renewed until it ends).
    - ``op_timeout``: longest wait for one database statement before it counts as failed.
    - ``priority_aging``: every this many seconds a claimable job has waited, its priority
      rises by one (from its enqueue priority, capped at 32767); None: no aging.
    - ``metrics_port``: serve /metrics, /healthz and /readyz on ``metrics_host`` (None: off).
    - ``retention``: succeeded/cancelled jobs older than this many seconds are pruned every
      ``prune_interval`` (None: keep them; dead jobs are never pruned), until none is
      left, in small batches paced so that deleting takes at most ``prune_share`` of the
      time (what is left for claims to share WAL with).
    - ``fair_key_retention``: every ``prune_interval``, the keys of fair queues idle this many
      seconds (no enqueue, wake-up or claim) with no job left are deleted (None: keep them;
      never a queue's key ``""`` or a weighted key); docs/fairness.md.
    - ``listen_dsn``: LISTEN over this direct connection instead (behind PgBouncer).
    - ``schedules``: run the schedule ticker (any number of workers may; each tick still
      enqueues one job) and store the app's declared schedules at start.
    - ``burst``: exit once nothing is claimable and nothing is running.
    - ``drain``: like burst, but also wait for scheduled retries of these queues.
    """

    queues: tuple[str | QueueSettings, ...] = field(
        default=("default",), metadata=_cli("", option=False)
    )
    concurrency: int = field(default=10, metadata=_cli("Handlers running at once.", short="-c"))
    prefetch: int = field(default=0, metadata=_cli("Leases held beyond free slots."))
    lease_seconds: float = field(default=60.0, metadata=_cli("Lease length in seconds."))
    heartbeat_interval: float | None = field(
        default=None,
        metadata=_cli("Renew leases this often (seconds). Default: a third of the lease."),
    )
    batch_size: int = field(default=100, metadata=_cli("Most jobs claimed in one statement."))
    adaptive_batch: bool = field(
        default=False,
        metadata=_cli(
            "Size claims (and prefetch) by the measured round trip instead of --batch-size."
        ),
    )
    claims_in_flight: int = field(
        default=2, metadata=_cli("Claim statements at once while the queues are busy.")
    )
    poll_interval: float = field(
        default=2.0, metadata=_cli("Check the table at least this often (seconds).")
    )
    sweep_interval: float = field(
        default=15.0, metadata=_cli("Recover expired leases this often (seconds).")
    )
    shutdown_timeout: float = field(
        default=30.0, metadata=_cli("Seconds running jobs get to finish at shutdown.")
    )
    stop_grace: float | None = field(
        default=30.0,
        metadata=_cli(
            "Seconds a stopped sync handler gets to end before the process exits "
            "(hard stop), or 'never'.",
            kind="duration_or_never",
        ),
    )
    op_timeout: float = field(
        default=10.0, metadata=_cli("Longest wait for one database statement (seconds).")
    )
    priority_aging: float | None = field(
        default=None,
        metadata=_cli(
            "Raise a waiting job's priority by 1 per this much waiting (e.g. 30s). Default: off.",
            kind="duration",
        ),
    )
    metrics_port: int | None = field(
        default=None, metadata=_cli("Serve /metrics, /healthz, /readyz on this port.")
    )
    metrics_host: str = field(default="127.0.0.1", metadata=_cli("Address of --metrics-port."))
    retention: float | None = field(
        default=7 * 86400.0,
        metadata=_cli(
            "Prune succeeded/cancelled jobs older than this (e.g. 1d), or 'never'.",
            kind="duration_or_never",
        ),
    )
    prune_interval: float = field(
        default=60.0,
        metadata=_cli("How often the worker prunes (until nothing is left).", kind="duration"),
    )
    fair_key_retention: float | None = field(
        default=3600.0,
        metadata=_cli(
            "Delete fair queues' keys idle this long with no job left (e.g. 1h), or 'never'.",
            kind="duration_or_never",
        ),
    )
    prune_share: float = field(
        default=0.2,
        metadata=_cli("Most of the time pruning may spend deleting (paced batches)."),
    )
    listen: bool = field(
        default=True,
        metadata=_cli("Do not LISTEN; rely on polling only.", kind="negated_flag"),
    )
    listen_dsn: str | None = field(
        default=None,
        metadata=_cli(
            "LISTEN over this direct connection (e.g. around PgBouncer); default: --dsn."
        ),
    )
    schedules: bool = field(
        default=True,
        metadata=_cli("Do not tick periodic schedules (others may).", kind="negated_flag"),
    )
    burst: bool = field(
        default=False, metadata=_cli("Exit once nothing is claimable and nothing runs.")
    )
    drain: bool = field(
        default=False, metadata=_cli("Exit once the queues have no pending job at all.")
    )
    worker_id: str = field(
        default_factory=default_worker_id,
        metadata=_cli("Lease owner name (default host:pid:random)."),
    )

    def __post_init__(self) -> None:
        settings = tuple(
            q if isinstance(q, QueueSettings) else QueueSettings(validate.check_name("queue", q))
            for q in self.queues
        )
        object.__setattr__(self, "queues", settings)
        if not settings:
            raise ConfigError("a worker needs at least one queue")
        names = [q.name for q in settings]
        if len(set(names)) != len(names):
            raise ConfigError(f"queue listed twice: {', '.join(names)}")
        validate.check_int("concurrency", self.concurrency, 1, 10_000)
        validate.check_int("prefetch", self.prefetch, 0, self.concurrency)
        validate.check_int("batch_size", self.batch_size, 1, validate.CLAIM_LIMIT_MAX)
        validate.check_int("claims_in_flight", self.claims_in_flight, 1, 8)
        validate.check_positive_seconds("lease_seconds", self.lease_seconds)
        validate.check_positive_seconds("poll_interval", self.poll_interval, 3600)
        validate.check_positive_seconds("sweep_interval", self.sweep_interval, 3600)
        validate.check_positive_seconds("shutdown_timeout", self.shutdown_timeout, 86400)
        validate.check_positive_seconds("op_timeout", self.op_timeout, 3600)
        if self.stop_grace is not None:
            validate.check_positive_seconds("stop_grace", self.stop_grace, 86400)
        if self.retention is not None:
            validate.check_positive_seconds("retention", self.retention, 100 * 365 * 86400.0)
        validate.check_positive_seconds("prune_interval", self.prune_interval, 86400)
        if not 0 < self.prune_share <= 1:
            raise ConfigError(f"prune_share must be in (0, 1], got {self.prune_share}")
        if self.priority_aging is not None:
            validate.check_positive_seconds("priority_aging", self.priority_aging, 86400.0)
        if self.metrics_port is not None:
            validate.check_int("metrics_port", self.metrics_port, 0, 65535)
        validate.check_worker_id(self.worker_id)
        if self.burst and self.drain:
            raise ConfigError("choose --burst or --drain, not both")
        if self.heartbeat_interval is not None:
            validate.check_positive_seconds("heartbeat_interval", self.heartbeat_interval)
            shortest = min(self.lease_for(q) for q in settings)
            if self.heartbeat_interval >= shortest:
                raise ConfigError(
                    f"heartbeat_interval ({self.heartbeat_interval:g}s) must be shorter than "
                    f"the lease ({shortest:g}s), or leases expire between renewals"
                )

    @property
    def queue_settings(self) -> tuple[QueueSettings, ...]:
        return tuple(q for q in self.queues if isinstance(q, QueueSettings))

    @property
    def queue_names(self) -> tuple[str, ...]:
        return tuple(q.name for q in self.queue_settings)

    def lease_for(self, queue: QueueSettings) -> float:
        return queue.lease_seconds or self.lease_seconds

    def batch_for(self, queue: QueueSettings) -> int:
        return queue.batch_size or self.batch_size

    @property
    def renew_every(self) -> float:
        """Renew at a third of the shortest lease, so two renewals can fail before it ends."""
        if self.heartbeat_interval is not None:
            return self.heartbeat_interval
        return min(self.lease_for(q) for q in self.queue_settings) / 3
