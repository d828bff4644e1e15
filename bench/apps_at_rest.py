"""The apps ``python -m bench.at_rest``'s worker subprocesses load: ``plain`` (no encryption,
payloads inline), ``sealed`` (every payload encrypted with the key in
``LEASEQ_ENCRYPTION_KEYS``) and ``offloaded`` (payloads over 64 KiB in the payloads table).
Each has one no-op async task, ``noop``."""

from __future__ import annotations

import os
from typing import Any

import leaseq


def _noop_app(**options: Any) -> leaseq.App:
    app = leaseq.App(**options)

    @app.task(name="noop")
    async def noop(ctx: leaseq.JobContext, payload: Any) -> None:
        pass

    return app


plain = _noop_app()
sealed = _noop_app(encrypt=True) if os.environ.get("LEASEQ_ENCRYPTION_KEYS") else plain
offloaded = _noop_app(offload_above=64 * 1024)
