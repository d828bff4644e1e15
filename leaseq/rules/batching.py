"""Pure: claim sizes from the measured round trip (issue 35). No I/O: the fetcher feeds it
each claim's size and time (``leaseq.worker.fetcher``) and asks it how many to claim next.

A claim of ``b`` jobs takes about ``t(b) = fixed + per_job * b``: ``fixed`` is what every
statement pays whatever its size (the network's round trip, the event loop's turn, the
statement's checks, the commit and its WAL flush), ``per_job`` the rows' own work. The share
of a claim's time spent on the fixed part is ``fixed / t(b)``. The size that keeps that share
at ``overhead`` is ``b = fixed * (1 - overhead) / (overhead * per_job)``: the round trip is
then amortised, and a larger claim would gain little while holding more leases before their
jobs start.

``ClaimCost`` is a least-squares fit of ``t(b)`` over decayed sums of the claims seen
(recent claims weigh most, so a server that slows down is followed). It needs claims of
different sizes to tell ``fixed`` from ``per_job``; until it has them (or when the fit says
nothing usable: a negative part), ``claim_size`` doubles the size it was given, within its
bounds, so the next claims bring the spread it needs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

#: The share of a claim's time its fixed part may take.
OVERHEAD = 0.10
#: Weight of everything seen before, at each new claim (about the last 20 claims count).
DECAY = 0.95
#: Least spread of the sizes seen (their standard deviation, in jobs) before the fit is used.
MIN_SPREAD = 2.0


@dataclass(frozen=True, slots=True)
class ClaimCost:
    """Decayed sums of (size, seconds) over the claims seen: weight, sizes, times, squares
    of the sizes and their products with the times."""

    n: float = 0.0
    sx: float = 0.0
    sy: float = 0.0
    sxx: float = 0.0
    sxy: float = 0.0

    def observe(self, jobs: int, seconds: float, decay: float = DECAY) -> ClaimCost:
        """This cost with one more claim of ``jobs`` jobs that took ``seconds``; claims that
        returned nothing or took no time say nothing about the fit and are left out."""
        if jobs <= 0 or not seconds > 0 or not math.isfinite(seconds):
            return self
        x, y = float(jobs), float(seconds)
        return ClaimCost(
            self.n * decay + 1.0,
            self.sx * decay + x,
            self.sy * decay + y,
            self.sxx * decay + x * x,
            self.sxy * decay + x * y,
        )

    def fit(self) -> tuple[float, float] | None:
        """``(fixed, per_job)`` seconds, or None while the sizes seen are too alike (or the
        fit has a part below zero, which no real statement has)."""
        if self.n < 2:
            return None
        mean_x = self.sx / self.n
        var_x = self.sxx / self.n - mean_x * mean_x
        if var_x < MIN_SPREAD * MIN_SPREAD:
            return None
        per_job = (self.sxy / self.n - mean_x * self.sy / self.n) / var_x
        fixed = self.sy / self.n - per_job * mean_x
        if per_job <= 0 or fixed < 0:
            return None
        return fixed, per_job


def amortised_size(fixed: float, per_job: float, overhead: float = OVERHEAD) -> float:
    """The claim size at which the fixed part is ``overhead`` of the claim's time."""
    return fixed * (1 - overhead) / (overhead * per_job)


def claim_size(
    cost: ClaimCost, *, current: int, floor: int, ceiling: int, overhead: float = OVERHEAD
) -> int:
    """How many jobs the next claim should ask for, within ``[floor, ceiling]`` (``floor``
    at most ``ceiling``): the amortised size of the fit, or, without a fit, twice
    ``current`` (the size asked for last)."""
    if not 0 < overhead < 1:
        raise ValueError(f"overhead must be in (0, 1), got {overhead}")
    floor = max(1, min(floor, ceiling))
    fit = cost.fit()
    want = 2.0 * current if fit is None else amortised_size(*fit, overhead)
    return max(floor, min(ceiling, math.ceil(want - 1e-6)))  # not up for a rounding error
