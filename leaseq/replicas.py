"""Read replicas, the pure part: the lag a replica reports, and how it is worked out.

``Client(read_dsn=...)`` sends inspection reads to a read replica (``leaseq.ops.reads_async``
owns that pool). The lag compares two positions read one after the other: the primary's
flushed WAL position, then what the replica has replayed. While the replica has replayed
everything the primary had flushed, the lag is zero (an idle primary writes nothing, so the
age of the last replayed transaction says nothing then); while it is behind, the lag in
seconds is the age of the newest transaction it replayed, an upper bound of how stale its
answers are.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ReplicaLag:
    """How far the read replica is behind the primary.

    ``in_recovery``: the read DSN is a standby (False: it is a primary itself, e.g. the same
    server, and has no lag). ``bytes``: WAL the primary has flushed and the replica not yet
    replayed. ``seconds``: 0 when caught up; else the age of the newest transaction the
    replica replayed (None when it replayed none since it started)."""

    in_recovery: bool
    bytes: int
    seconds: float | None

    def as_dict(self) -> dict[str, Any]:
        return {"in_recovery": self.in_recovery, "bytes": self.bytes, "seconds": self.seconds}

    def describe(self) -> str:
        """One line for ``leaseq status`` and the dashboard."""
        if not self.in_recovery:
            return "read replica: not a standby (no lag)"
        if self.bytes == 0:
            return "read replica: caught up (lag 0s)"
        seconds = "unknown" if self.seconds is None else f"{self.seconds:.1f}s"
        return f"read replica: lag {seconds}, {self.bytes} bytes of WAL behind"


def lag_from_row(row: tuple[Any, ...]) -> ReplicaLag:
    """The ``replica_lag`` statement's row: (in recovery, bytes behind, replay age)."""
    in_recovery, behind, age = row
    if not in_recovery:
        return ReplicaLag(False, 0, 0.0)
    behind = max(int(behind or 0), 0)
    if behind == 0:
        return ReplicaLag(True, 0, 0.0)
    return ReplicaLag(True, behind, None if age is None else max(float(age), 0.0))


def unknown_lag_line(exc: BaseException) -> str:
    """The lag line when it could not be read (the primary, or the replica, did not answer):
    the replica's pages and counts are still shown, this says how much to trust them."""
    text = str(exc).strip()
    first = text.splitlines()[0] if text else type(exc).__name__
    return f"read replica: lag unknown ({first})"
