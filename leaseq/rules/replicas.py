"""Read replicas, the pure part: the lag a replica reports, how it is worked out, and how
``leaseq status`` shows it.

``Client(read_dsn=...)`` sends inspection reads to a read replica (``leaseq.ops.reads_async``
owns that pool). The lag compares two positions read one after the other: the primary's
flushed WAL position, then what the replica has replayed. While the replica has replayed
everything the primary had flushed, the lag is zero (an idle primary writes nothing, so the
age of the last replayed transaction says nothing then); while it is behind, the lag in
seconds is the age of the newest transaction it replayed, an upper bound of how stale its
answers are. The same reading (``Client.read_replica_lag``, the ``replica_lag`` statement)
feeds ``leaseq_read_replica_lag_seconds``, ``leaseq status`` and the dashboard.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from leaseq.dsn import describe_dsn


@dataclass(frozen=True)
class ReplicaLag:
    """How far the read replica is behind the primary.

    ``in_recovery``: the read DSN is a standby (False: it is a primary itself, e.g. the same
    server, and has no lag). ``bytes``: WAL the primary has flushed and the replica not yet
    replayed. ``seconds``: 0 when caught up; else the age of the newest transaction the
    replica replayed (None when it replayed none since it started). ``server``: which
    server answered, as ``host:port`` (what it says of itself; not part of equality)."""

    in_recovery: bool
    bytes: int
    seconds: float | None
    server: str | None = field(default=None, compare=False)

    def as_dict(self) -> dict[str, Any]:
        return {
            "in_recovery": self.in_recovery,
            "bytes": self.bytes,
            "seconds": self.seconds,
            "server": self.server,
        }

    def describe(self) -> str:
        """One line for ``leaseq status`` and the dashboard."""
        if not self.in_recovery:
            return "read replica: not a standby (no lag)"
        if self.bytes == 0:
            return "read replica: caught up (lag 0s)"
        seconds = "unknown" if self.seconds is None else f"{self.seconds:.1f}s"
        return f"read replica: lag {seconds}, {self.bytes} bytes of WAL behind"


def lag_from_row(row: tuple[Any, ...]) -> ReplicaLag:
    """The ``replica_lag`` statement's row: (in recovery, bytes behind, replay age, server)."""
    in_recovery, behind, age, server = row
    server = None if server is None else str(server)
    if not in_recovery:
        return ReplicaLag(False, 0, 0.0, server)
    behind = max(int(behind or 0), 0)
    if behind == 0:
        return ReplicaLag(True, 0, 0.0, server)
    return ReplicaLag(True, behind, None if age is None else max(float(age), 0.0), server)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def unknown_lag_line(exc: BaseException) -> str:
    """The lag line when it could not be read (the primary, or the replica, did not answer):
    the replica's pages and counts are still shown, this says how much to trust them."""
    return f"read replica: lag unknown ({_first_line(exc)})"


def reads_from_line(read_dsn: str, lag: ReplicaLag | None) -> str:
    """``leaseq status``'s line naming the server its reads went to: the one that answered
    the lag's reading when there is one, and always the read DSN (without its password)."""
    configured = describe_dsn(read_dsn)
    if lag is None or lag.server is None:
        return f"reads from: read DSN {configured}"
    return f"reads from: {lag.server} (read DSN {configured})"


def replica_report(
    read_dsn: str, lag: ReplicaLag | None, error: BaseException | None = None
) -> dict[str, Any]:
    """``leaseq status --json``'s ``read_replica`` object: the read DSN (without its
    password), the server that answered (None while the lag cannot be read), whether it is
    a standby, its lag in seconds and bytes (as ``leaseq_read_replica_lag_seconds``: 0 when
    caught up; seconds None when unknown), and why the lag is unknown (else None)."""
    return {
        "read_dsn": describe_dsn(read_dsn),
        "server": None if lag is None else lag.server,
        "in_recovery": None if lag is None else lag.in_recovery,
        "lag_seconds": None if lag is None else lag.seconds,
        "lag_bytes": None if lag is None else lag.bytes,
        "error": None if error is None else _first_line(error),
    }
