"""The app the ``drain-leaseq`` scenario's worker subprocess loads (``bench.apps:app``).

The handler does nothing, so what is measured is the queue's own cost per job.
"""

from __future__ import annotations

from typing import Any

import leaseq

app = leaseq.App()


@app.task(name="noop")
async def noop(ctx: leaseq.JobContext, payload: Any) -> None:
    pass
