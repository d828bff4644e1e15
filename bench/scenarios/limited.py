"""``drain-limited``: ``drain-leaseq``'s drain (one worker process, async no-op handler,
``--burst``) with a concurrency limit on the drained queue that is never reached
(``queue:default`` at 100,000). Its ratio to ``drain-leaseq`` in the same round is issue
16's target: a limit that is never reached costs at most 10% of the drain. ``bench.limits``
measures the same through the client alone (claims of 100, one fenced completion each), and
a limit of 50 besides.
"""

from __future__ import annotations

import leaseq
from bench.harness import QUEUE, Metric, Ratio, Sample, Scenario, Settings
from bench.scenarios.regression import drain_after

NAME = "drain-limited"
#: Far above anything a worker runs at once: every claim takes slots, none is refused.
NEVER_REACHED = 100_000


def limit_never_reached(client: leaseq.Client) -> None:
    client.set_limit(f"queue:{QUEUE}", concurrency=NEVER_REACHED)


def drain_limited(settings: Settings) -> dict[str, Sample]:
    return drain_after(settings, NAME, limit_never_reached)


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
