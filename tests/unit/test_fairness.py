"""WeightedShares in chunks: how a worker's free slots become claim statements when it
serves many busy queues (pure, no database)."""

from __future__ import annotations

import collections

from leaseq.worker.fairness import WeightedShares


def test_many_busy_queues_get_a_few_full_claims_a_round_not_one_slot_each() -> None:
    shares = WeightedShares([1] * 100)
    split = shares.split(100, picks=4)
    assert sum(split) == 100
    assert sorted(n for n in split if n) == [25, 25, 25, 25]


def test_chunked_rounds_still_serve_every_queue_and_follow_the_weights() -> None:
    queues = 10
    shares = WeightedShares([1] * queues)
    served: collections.Counter[int] = collections.Counter()
    first_round: dict[int, int] = {}
    for round_no in range(30):
        for i, n in enumerate(shares.split(40, picks=4)):
            if n:
                served[i] += n
                first_round.setdefault(i, round_no)
    assert all(served[i] == 120 for i in range(queues)), served
    assert max(first_round.values()) <= -(-queues // 4) - 1, "each served within ceil(Q/N) rounds"

    weighted = WeightedShares([5, 1])
    totals = [0, 0]
    for _ in range(60):
        for i, n in enumerate(weighted.split(12, picks=4)):
            totals[i] += n
    assert totals[0] == 5 * totals[1]


def test_eligible_queues_only_and_no_slot_lost_to_rounding() -> None:
    shares = WeightedShares([1, 1, 1])
    split = shares.split(7, [True, False, True], picks=2)
    assert split[1] == 0 and sum(split) == 7
    assert WeightedShares([3]).split(9, picks=4) == [9]


def test_a_few_freed_slots_go_to_one_queue_not_to_every_pick() -> None:
    # 20 slots over 100 busy queues with 4 picks were 4 claims of 5 jobs; with a minimum
    # chunk of 25 they are one claim of 20, and the credits still rotate the queues.
    shares = WeightedShares([1] * 100)
    first = shares.split(20, picks=4, min_chunk=25)
    assert sorted(s for s in first if s) == [20]
    assert shares.split(200, picks=4, min_chunk=25).count(50) == 4  # big rounds as before
    served = set()
    for _ in range(100):
        served.update(i for i, s in enumerate(shares.split(20, picks=4, min_chunk=25)) if s)
    assert len(served) == 100  # every queue is served, one chunk a round
