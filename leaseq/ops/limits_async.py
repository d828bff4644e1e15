"""Flow control: set, remove and list concurrency and rate limits (audited in
``admin_events``), charge a rate limit for work done outside jobs, and the claim's hint of
how long a rate limit holds a queue back.

Limits are rows every claim reads (migration 0011, ``admit()``): a change applies to the
next claim of every worker. See ``leaseq.rules.limits`` for names and families.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from leaseq import validate
from leaseq.errors import ConfigError
from leaseq.ops.base_async import AsyncClientBase
from leaseq.rules.limits import (
    Limit,
    RateLimit,
    check_limit_name,
    limit_from_row,
    limit_params,
)
from leaseq.rules.pauses import check_actor, check_reason


class AsyncLimitOps(AsyncClientBase):
    async def set_limit(
        self,
        name: str,
        *,
        concurrency: int | None = None,
        rate: RateLimit | None = None,
        actor: str | None = None,
        reason: str | None = None,
    ) -> None:
        """Set the limit ``name`` (``queue:NAME``, ``task:NAME``, ``key:KEY`` or a family
        ``key:PREFIX:*``): at most ``concurrency`` of its jobs run at once, and claims are
        admitted at most at ``rate``. Replaces what was set before; audited."""
        params = limit_params(
            name,
            concurrency,
            rate,
            check_actor(actor),
            check_reason("limit", reason, required=False),
        )
        await self._rows("set_limit", params)

    async def declare_limit(
        self,
        name: str,
        *,
        concurrency: int | None = None,
        rate: RateLimit | None = None,
        actor: str | None = None,
    ) -> bool:
        """What a worker does at start for its tasks' declared limits: set it unless it is
        already set to exactly this. Returns True when something changed."""
        params = limit_params(name, concurrency, rate, check_actor(actor), None)
        return bool(await self._rows("declare_limit", params))

    async def remove_limit(
        self, name: str, *, actor: str | None = None, reason: str | None = None
    ) -> bool:
        """Remove a limit; False when there was none. Slots held by running jobs are given
        back as they finish; nothing is held back by it from the next claim on."""
        params = {
            "name": check_limit_name(name),
            "actor": check_actor(actor),
            "reason": check_reason("limit", reason, required=False),
        }
        return bool(await self._rows("remove_limit", params))

    async def limits(self) -> list[Limit]:
        """Every limit with its slots in use, jobs waiting and rate bucket state."""
        return [limit_from_row(row) for row in await self._read("list_limits", {})]

    async def rate_consume(self, name: str, cost: int = 1) -> bool:
        """Charge ``cost`` units to the rate limit ``name`` (the bucket claims use); True
        when admitted, False when the bucket cannot take them now (nothing is charged)."""
        params = {
            "name": check_limit_name(name),
            "cost": validate.check_int("cost", cost, 1, 1_000_000),
        }
        rows = await self._rows("rate_consume", params)
        if not rows:
            raise ConfigError(f"no rate limit named {name!r} (or its family)")
        return bool(rows[0][0])

    async def rate_available(self, name: str) -> tuple[int, float]:
        """(units the bucket would admit now, seconds until the next one frees up)."""
        rows = await self._rows("rate_available", {"name": check_limit_name(name)})
        if not rows:
            raise ConfigError(f"no rate limit named {name!r} (or its family)")
        return int(rows[0][0]), float(rows[0][1] or 0.0)

    async def claim_wait(self, queues: Sequence[str]) -> tuple[bool, float | None]:
        """(any limit exists, seconds until a rate limit admits one of these queues' first
        claimable jobs, or None). The fetcher's hint after a short claim."""
        rows: list[Any] = await self._rows("claim_wait", {"queues": list(queues)})
        exists, wait = rows[0]
        return bool(exists), None if wait is None else float(wait)
