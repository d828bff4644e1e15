"""Start deadlines (expires=, migration 0019) on a real PostgreSQL: a job past its deadline
is never claimed (the claim's own clock), the sweep ends it cancelled with EXPIRED exactly
once, its keys and dependents move on, a replay brings it back (audited), and under a
saturated queue with claims and sweeps racing no job starts after its deadline."""

from __future__ import annotations

import datetime as dt
import threading
import time

import pytest

import leaseq
from leaseq import JobStatus
from leaseq.errors import ConfigError
from tests.support.helpers import rows, run_sql


def _past(dsn: str, schema: str, *ids: int) -> None:
    """Move the deadlines of these jobs into the past (database clock)."""
    run_sql(
        dsn,
        "UPDATE {s}.jobs SET expires_at = now() - interval '1 second' WHERE id = ANY(%s)",
        schema,
        list(ids),
    )


def _events(dsn: str, schema: str, job_id: int) -> list[tuple[str, str]]:
    found = rows(
        dsn,
        "SELECT event, to_status::text FROM {s}.job_events WHERE job_id = %s ORDER BY id",
        schema,
        job_id,
    )
    return [(str(e), str(t)) for e, t in found]


def test_expires_is_stored_as_an_instant_on_the_database_clock(
    client: leaseq.Client, dsn: str, schema: str
) -> None:
    at = dt.datetime.now(dt.UTC) + dt.timedelta(hours=2)
    a = client.enqueue("t", expires=at)
    b = client.enqueue("t", expires=60)
    c = client.enqueue("t", expires=dt.timedelta(minutes=5))
    d = client.enqueue("t")
    got = dict(
        rows(
            dsn,
            "SELECT id, expires_at - now() FROM {s}.jobs WHERE id = ANY(%s)",
            schema,
            [a, b, c, d],
        )
    )
    assert got[d] is None
    assert dt.timedelta(seconds=55) < got[b] <= dt.timedelta(seconds=60)
    assert dt.timedelta(minutes=4) < got[c] <= dt.timedelta(minutes=5)
    assert dt.timedelta(hours=1, minutes=59) < got[a] <= dt.timedelta(hours=2)
    for bad in (0, -1, "soon", True, dt.datetime(2030, 1, 1)):
        with pytest.raises(ConfigError, match="expires"):
            client.enqueue("t", expires=bad)  # type: ignore[arg-type]


def test_a_job_past_its_deadline_is_never_claimed_and_ends_expired_once(
    client: leaseq.Client, dsn: str, schema: str
) -> None:
    # Boundary: the deadline passes while the job waits. Invariant: no claim takes it, the
    # sweep ends it cancelled (EXPIRED) with one 'expired' event, a second sweep does nothing.
    late = client.enqueue("t", 1, expires=3600)
    fresh = client.enqueue("t", 2, expires=3600)
    _past(dsn, schema, late)
    assert [lease.job_id for lease in client.claim("default", worker="w", limit=10)] == [fresh]
    first = client.sweep()
    assert first.expired == 1
    assert client.sweep().expired == 0
    job = client.get_job(late)
    assert job is not None and job.status is JobStatus.CANCELLED
    assert job.last_error_code == "EXPIRED" and job.started_at is None
    assert _events(dsn, schema, late) == [("expired", "cancelled")]


def test_an_expired_head_lets_its_key_and_dependents_move_on(
    client: leaseq.Client, dsn: str, schema: str
) -> None:
    head = client.enqueue("t", 1, ordering_key="k", expires=3600)
    nxt = client.enqueue("t", 2, ordering_key="k")
    parent = client.enqueue("t", 3, expires=3600, unique_key="u")
    child = client.enqueue("t", 4, depends_on=[parent], on_dead="run")
    _past(dsn, schema, head, parent)
    assert client.sweep().expired == 2
    claimed = sorted(lease.job_id for lease in client.claim("default", worker="w", limit=10))
    # The key's next job heads it; the child runs (on_dead="run"); the unique key is free.
    assert claimed == [nxt, child]
    again = client.enqueue("t", 5, unique_key="u", on_conflict="skip")
    assert again != parent


def test_an_expired_job_can_be_replayed_and_the_replay_is_audited(
    client: leaseq.Client, dsn: str, schema: str
) -> None:
    job_id = client.enqueue("t", expires=3600)
    _past(dsn, schema, job_id)
    assert client.sweep().expired == 1
    assert client.replay(job_id, reason="deadline moved", actor="ops", allow_cancelled=True)
    (lease,) = client.claim("default", worker="w")
    assert lease.job_id == job_id
    trail = rows(
        dsn,
        "SELECT event, actor, detail FROM {s}.job_events WHERE job_id = %s ORDER BY id",
        schema,
        job_id,
    )
    assert [t[0] for t in trail] == ["expired", "replayed"]
    assert trail[1][1:] == ("ops", "deadline moved")


def test_every_bulk_path_stores_the_deadline(client: leaseq.Client, dsn: str, schema: str) -> None:
    small = client.enqueue_many(
        [{"task": "t", "expires": 30}, {"task": "t", "ordering_key": "o", "expires": 30}]
    )
    big = client.enqueue_many([{"task": "t", "expires": 30} for _ in range(250)])
    ids = [*small, big[0], big[-1]]
    waits = rows(dsn, "SELECT expires_at - now() FROM {s}.jobs WHERE id = ANY(%s)", schema, ids)
    assert len(waits) == 4
    assert all(dt.timedelta(seconds=20) < w <= dt.timedelta(seconds=30) for (w,) in waits)


@pytest.mark.slow
def test_no_job_starts_after_its_deadline_under_a_saturated_queue(
    client: leaseq.Client, dsn: str, schema: str
) -> None:
    # Boundary: claims and sweeps race while deadlines pass (a queue far behind: 2,000 jobs,
    # deadlines 0-2 s away, four claimers taking 5 at a time and holding each a little).
    # Invariant, on the database clock: every started job started before its deadline; every
    # job that did not start ended EXPIRED with exactly one 'expired' event.
    specs = [{"task": "t", "payload": i, "expires": 0.01 + (i % 200) / 100} for i in range(2000)]
    client.enqueue_many(specs)
    stop = threading.Event()

    def claimer() -> None:
        while not stop.is_set():
            for lease in client.claim("default", worker="w", limit=5):
                time.sleep(0.001)
                client.complete(lease)

    def sweeper() -> None:
        while not stop.is_set():
            client.sweep(batch_size=50)
            time.sleep(0.01)

    threads = [threading.Thread(target=claimer) for _ in range(4)]
    threads.append(threading.Thread(target=sweeper))
    for t in threads:
        t.start()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        ((left,),) = rows(dsn, "SELECT count(*) FROM {s}.jobs WHERE status = 'pending'", schema)
        if left == 0:
            break
        time.sleep(0.2)
    stop.set()
    for t in threads:
        t.join()
    client.sweep()
    ((late,),) = rows(
        dsn,
        "SELECT count(*) FROM {s}.jobs WHERE started_at IS NOT NULL AND started_at >= expires_at",
        schema,
    )
    assert late == 0
    outcome = dict(rows(dsn, "SELECT status::text, count(*) FROM {s}.jobs GROUP BY 1", schema))
    assert set(outcome) <= {"succeeded", "cancelled"} and sum(outcome.values()) == 2000
    assert outcome.get("cancelled", 0) > 0, "some deadlines passed: the queue was saturated"
    bad = rows(
        dsn,
        "SELECT j.id FROM {s}.jobs AS j WHERE j.status = 'cancelled' AND (j.started_at IS NOT NULL"
        " OR j.last_error_code <> 'EXPIRED' OR (SELECT count(*) FROM {s}.job_events AS e"
        " WHERE e.job_id = j.id AND e.event = 'expired') <> 1)",
        schema,
    )
    assert bad == []
