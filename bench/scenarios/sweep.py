"""The ``sweep-recovery`` scenario: one ``Client.sweep()`` recovering E expired leases
written straight into the jobs table."""

from __future__ import annotations

import time

from bench.db import EXPIRED_LEASE_ROWS, connect, fresh_schema, insert_rows, settle, status_counts
from bench.harness import BenchError, Metric, Sample, Scenario, Settings

NAME = "sweep-recovery"


def sweep_recovery(settings: Settings) -> dict[str, Sample]:
    """``Client.sweep()`` recovering E expired leases (default batches of 1000)."""
    with fresh_schema(settings.dsn, NAME) as client:
        with connect(settings.dsn) as conn:
            insert_rows(conn, client.schema, EXPIRED_LEASE_ROWS, settings.expired)
            settle(conn, client.schema, settings.checkpoint)
        started = time.perf_counter()
        result = client.sweep()
        elapsed = time.perf_counter() - started
        counts = status_counts(settings.dsn, client.schema)
    recovered = result.requeued + result.dead
    if recovered != settings.expired or counts.get("running", 0):
        raise BenchError(
            f"sweep recovered {recovered} of {settings.expired} expired leases; table: {counts}"
        )
    return {
        "sweep-rate": Sample(recovered, elapsed),
        "sweep-seconds": Sample(recovered, elapsed, elapsed),
    }


SCENARIO = Scenario(
    NAME,
    "Client.sweep() recovering E expired leases",
    (
        Metric("sweep-rate", NAME, "Client.sweep()", "leases/s"),
        Metric("sweep-seconds", NAME, "Client.sweep(), total (target <= 10)", "s"),
    ),
    sweep_recovery,
)
