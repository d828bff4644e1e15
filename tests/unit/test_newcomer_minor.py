"""Issue 30's minor items that need no database: a failed result's message has no
trailing space, an enqueue's result shows what happened in its repr (and still prints as
the id), and a queue's JSON says null where the table says ``-``."""

from __future__ import annotations

import json

from leaseq.errors import JobDead
from leaseq.models import QueueStats
from leaseq.rules.unique import EnqueueResult


def test_a_failed_results_message_ends_cleanly() -> None:
    assert str(JobDead(7, "dead", "BOOM", None)) == "job 7 ended dead (BOOM)"
    assert str(JobDead(7, "dead", "BOOM", "trace\n  last line  \n")) == (
        "job 7 ended dead (BOOM): last line"
    )


def test_an_enqueue_result_shows_what_happened_and_prints_as_the_id() -> None:
    plain, held = EnqueueResult(7), EnqueueResult(9, inserted=False, conflict_state="pending")
    assert (repr(plain), str(plain), f"{plain}", json.dumps(plain)) == (
        "EnqueueResult(7)",
        "7",
        "7",
        "7",
    )
    assert repr(held) == (
        "EnqueueResult(9, inserted=False, replaced=False, conflict_state='pending', outcome=None)"
    )
    assert str(held) == "9"


def test_queue_json_has_null_ages_where_the_table_shows_a_dash() -> None:
    empty = QueueStats("mail", 0, 3, 0, 0, 0.0, 0.0, 0)
    busy = QueueStats("mail", 2, 0, 0, 1, 4.5, 60.0, 0)
    assert (empty.as_dict()["oldest_ready_age"], empty.as_dict()["oldest_dead_age"]) == (
        None,
        None,
    )
    assert (busy.as_dict()["oldest_ready_age"], busy.as_dict()["oldest_dead_age"]) == (4.5, 60.0)
