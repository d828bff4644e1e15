"""Two leaseq schemas in one database (migration 0037): the advisory locks a claim takes on the
slot numbers and rate buckets it is taking are the schema's own. Boundary: a claim in one
schema left open (its locks held until it commits) while a claim of the other schema, with a
limit of the same name, takes the same numbers. The invariant: each schema's limits admit as
much as they allow, whatever the other schema's claims in flight hold; nothing is double-held."""

from __future__ import annotations

from collections.abc import Callable

import psycopg
import pytest

import leaseq
from leaseq import RateLimit
from tests.support.helpers import rows

Setup = Callable[[leaseq.Client], None]


def _task_slot(c: leaseq.Client) -> None:
    c.set_limit("task:t", concurrency=1)  # slot rows: free_slots()


def _queue_slot(c: leaseq.Client) -> None:
    # A task limit too, so the claim takes admit()'s path: free_queue_slots().
    c.set_limit("queue:q", concurrency=1)
    c.set_limit("task:t", concurrency=5)


def _rate_bucket(c: leaseq.Client) -> None:
    c.set_limit("task:t", rate=RateLimit(1, per=3600, burst=1))  # the bucket's lock


@pytest.mark.parametrize("setup", [_task_slot, _queue_slot, _rate_bucket])
def test_a_claim_in_flight_in_one_schema_refuses_nothing_in_another(
    client: leaseq.Client, second_client: leaseq.Client, dsn: str, schema: str, setup: Setup
) -> None:
    other = second_client
    for c in (client, other):
        setup(c)
        c.enqueue_many([{"task": "t", "queue": "q"} for _ in range(2)])
    with psycopg.connect(dsn) as first:  # schema one's claim, left open: its locks held
        mine = client.claim("q", worker="a", limit=2, connection=first)
        assert len(mine) == 1, "the limit admits one"
        theirs = other.claim("q", worker="b", limit=2)
        assert len(theirs) == 1, "the other schema's limit of one name is its own"
        first.commit()
    for c, s in ((client, schema), (other, other.schema)):
        running = rows(dsn, "SELECT count(*) FROM {s}.jobs WHERE status = 'running'", s)
        assert running == [(1,)]
        assert len(c.claim("q", worker="c", limit=2)) == 0, "each limit is still full"
