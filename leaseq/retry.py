"""Back-off policy for retries: exponential growth, full jitter, a cap.

Pure: the random source is passed in, so tests can pin it and production can share one.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

from leaseq.errors import ConfigError


@dataclass(frozen=True)
class RetryPolicy:
    """Delay before retry ``attempt`` (1-based): ``uniform(0, min(cap, base * factor**(n-1)))``.

    Full jitter spreads retries of jobs that failed together (one outage) over the whole
    window instead of bunching them at the same instant. A handler's explicit ``retry_in``
    wins, but never beyond ``cap``.
    """

    base: float = 2.0
    factor: float = 2.0
    cap: float = 600.0
    rng: Callable[[], float] = field(default=random.random, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not (self.base > 0 and self.factor >= 1 and self.cap >= self.base):
            raise ConfigError(
                f"invalid retry policy: need base > 0, factor >= 1, cap >= base "
                f"(got base={self.base}, factor={self.factor}, cap={self.cap})"
            )

    def ceiling(self, attempt: int) -> float:
        """Largest delay the policy may choose after ``attempt`` failed."""
        exponent = max(0, attempt - 1)
        # Compare in log space would be exact too; capping the exponent avoids overflow.
        if exponent > 1000:
            return self.cap
        return float(min(self.cap, self.base * self.factor**exponent))

    def delay(self, attempt: int, retry_in: float | None = None) -> float:
        if retry_in is not None:
            return float(min(max(0.0, retry_in), self.cap))
        return self.rng() * self.ceiling(attempt)
