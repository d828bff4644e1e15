"""``drain-limited``: ``drain-leaseq``'s drain (one worker process, async no-op handler,
``--burst``) with a concurrency limit on the drained queue that is never reached
(``queue:default`` at 100,000). Its ratio to ``drain-leaseq`` in the same round is issue
16's target: a limit that is never reached costs at most 10% of the drain. ``bench.limits``
measures the same through the client alone (claims of 100, one fenced completion each), and
a limit of 50 besides.
"""

from __future__ import annotations

from bench.db import check_drained, drain_clock, fill_queue, fresh_schema
from bench.harness import (
    QUEUE,
    BenchError,
    Metric,
    Ratio,
    Sample,
    Scenario,
    Settings,
    leaseq_root,
    run_burst_worker,
)

NAME = "drain-limited"
#: Far above anything a worker runs at once: every claim takes slots, none is refused.
NEVER_REACHED = 100_000


def drain_limited(settings: Settings) -> dict[str, Sample]:
    with fresh_schema(settings.dsn, NAME) as client:
        fill_queue(settings.dsn, client, settings.jobs)
        client.set_limit(f"queue:{QUEUE}", concurrency=NEVER_REACHED)
        wall, lines = run_burst_worker(settings, client.schema, cwd=leaseq_root())
        processed = int(lines[0]["jobs"])
        if processed != settings.jobs:
            raise BenchError(f"worker processed {processed} of {settings.jobs}: {lines[0][0]}")
        check_drained(settings.dsn, client.schema, settings.jobs, queue=QUEUE)
        db = drain_clock(settings.dsn, client.schema, queue=QUEUE)
    return {f"{NAME}-db": Sample(processed, db), f"{NAME}-wall": Sample(processed, wall)}


SCENARIO = Scenario(
    NAME,
    "drain-leaseq's drain under a concurrency limit on its queue that is never reached",
    (
        Metric(
            f"{NAME}-db", NAME, "leaseq async, 1p, queue limit never reached, start-up excluded"
        ),
        Metric(f"{NAME}-wall", NAME, "leaseq async, 1p, queue limit never reached, process wall"),
    ),
    drain_limited,
)

RATIOS = (
    Ratio(
        "drain under a queue limit never reached / plain drain, start-up excluded (>= 0.91)",
        f"{NAME}-db",
        "drain-leaseq-db",
    ),
    Ratio(
        "drain under a queue limit never reached / plain drain, process wall",
        f"{NAME}-wall",
        "drain-leaseq-wall",
    ),
)
