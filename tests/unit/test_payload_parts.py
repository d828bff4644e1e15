"""How a claim's offloaded payloads are split into fetch statements (leaseq.payload_store),
without a database: parts of about a byte budget by the markers' sizes, in order, never an
empty part, a payload over the budget alone in its part; and what decoding a fetched text
gives (its value, or the ValueError that ends only that job)."""

from __future__ import annotations

import json

from leaseq.payload_store import decoded, fetch_parts, marked_bytes, marker


def test_parts_fill_up_to_the_budget_in_claim_order() -> None:
    sizes = [(1, 40), (2, 40), (3, 40), (4, 10), (5, 90), (6, 5)]
    assert fetch_parts(sizes, 100) == [[1, 2], [3, 4], [5, 6]]


def test_a_payload_over_the_budget_is_a_part_of_its_own() -> None:
    assert fetch_parts([(1, 10), (2, 500), (3, 10)], 100) == [[1], [2], [3]]
    assert fetch_parts([(1, 500)], 100) == [[1]]


def test_unknown_sizes_share_a_part_and_nothing_gives_no_part() -> None:
    assert fetch_parts([(1, 0), (2, 0), (3, 0)], 100) == [[1, 2, 3]]
    assert fetch_parts([], 100) == []


def test_the_default_budget_splits_a_claim_of_1_mb_payloads() -> None:
    parts = fetch_parts([(i, 1_000_000) for i in range(100)])
    assert len(parts) > 4 and sum(len(p) for p in parts) == 100
    assert [i for p in parts for i in p] == list(range(100))


def test_the_marker_gives_the_size_and_a_bad_marker_gives_none() -> None:
    assert marked_bytes(json.loads(marker("pg", 70_000))) == 70_000
    assert marked_bytes({"leaseq:ref": "pg", "bytes": "big"}) == 0
    assert marked_bytes({"leaseq:ref": "pg", "bytes": True}) == 0
    assert marked_bytes({"leaseq:ref": "pg"}) == 0


def test_a_fetched_text_decodes_or_gives_its_error() -> None:
    assert decoded('{"doc": [1, 2]}') == {"doc": [1, 2]}
    assert isinstance(decoded('{"doc": '), ValueError)
