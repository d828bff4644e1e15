"""How a worker serving several queues splits its free slots: by weight, never starving.

Smooth weighted round robin (the scheme nginx uses for upstreams): every slot handed out
raises each queue's credit by its weight, and the queue with most credit gets the slot and
pays back the total. Over time each queue gets slots in proportion to its weight, and
even weight 1 next to weight 100 gets a slot within every 101. Pure, and stateful only in
the credits it keeps between rounds.

A round hands slots out in chunks: each claim statement is a round trip and a commit, so
200 slots over 100 busy queues must not become 100 claims of 2 jobs. ``split(...,
picks=N)`` gives at most N queues a share this round (chunks of ``ceil(slots / N)``); the
credits carry over, so the long-run shares still follow the weights and no queue starves:
with equal weights each of Q busy queues is served within every ``ceil(Q / N)`` rounds
(``min_chunk`` makes a round of few slots one chunk: then within every Q rounds).
"""

from __future__ import annotations

from collections.abc import Sequence


class WeightedShares:
    def __init__(self, weights: Sequence[int]) -> None:
        if not weights or any(w < 1 for w in weights):
            raise ValueError("weights must be positive")
        self._weights = list(weights)
        self._credit = [0] * len(weights)

    def next(self, eligible: Sequence[bool] | None = None) -> int:
        """Index of the queue that gets the next slot (among ``eligible`` ones)."""
        total = 0
        best = -1
        for i, weight in enumerate(self._weights):
            if eligible is not None and not eligible[i]:
                continue
            self._credit[i] += weight
            total += weight
            if best < 0 or self._credit[i] > self._credit[best]:
                best = i
        if best < 0:
            raise ValueError("no eligible queue")
        self._credit[best] -= total
        return best

    def split(
        self,
        slots: int,
        eligible: Sequence[bool] | None = None,
        *,
        picks: int | None = None,
        min_chunk: int = 1,
    ) -> list[int]:
        """How many of ``slots`` each queue gets this round; with ``picks``, slots go in
        at most that many chunks (one weighted pick each), none smaller than ``min_chunk``
        unless fewer slots are left (so a few freed slots go to one queue, not to four)."""
        shares = [0] * len(self._weights)
        if len(shares) == 1:  # one queue: every slot is its own, no credits to keep
            if slots and eligible is not None and not eligible[0]:
                raise ValueError("no eligible queue")
            shares[0] = slots
            return shares
        chunk = 1 if picks is None else max(1, -(-slots // max(1, picks)))
        chunk = max(chunk, min_chunk)
        left = slots
        while left > 0:
            given = min(chunk, left)
            shares[self.next(eligible)] += given
            left -= given
        return shares
