"""Job dependencies on a real PostgreSQL: a dependent waits outside the claim index until
the fenced transition that ends its last dependency promotes it, in the same transaction;
a failed dependency cancels it (or not, by policy); bad edges store nothing."""

from __future__ import annotations

import threading
import time

import psycopg
import pytest

import leaseq
from leaseq import Dep, JobStatus, Ref
from tests.support.helpers import expire_lease, rows


def _claim_ids(client: leaseq.Client, limit: int = 50) -> dict[int, leaseq.Lease]:
    return {x.job_id: x for x in client.claim("default", worker="w", limit=limit)}


def _status(client: leaseq.Client, job_id: int) -> JobStatus:
    return client.get_job(job_id).status


def _waiting(dsn: str, schema: str, job_id: int) -> bool:
    return bool(rows(dsn, "SELECT waiting FROM {s}.jobs WHERE id = %s", schema, job_id)[0][0])


def _events(client: leaseq.Client, job_id: int) -> list[str]:
    return [e.event for e in client.job_events(job_id)]


def test_dependent_is_not_claimable_until_its_dependency_succeeds(
    client: leaseq.Client, dsn: str, schema: str
) -> None:
    parent = client.enqueue("t", 1)
    child = client.enqueue("t", 2, depends_on=[parent])
    leases = _claim_ids(client)
    assert set(leases) == {parent}, "a waiting job was claimed"
    assert client.complete(leases[parent])
    assert not _waiting(dsn, schema, child)
    assert set(_claim_ids(client)) == {child}
    assert "promoted" in _events(client, child)


def test_diamond_in_one_enqueue_many_with_refs(client: leaseq.Client) -> None:
    a, b, c, d = client.enqueue_many(
        [
            {"task": "t"},
            {"task": "t", "depends_on": [Ref(0)]},
            {"task": "t", "depends_on": [Ref(-2)]},
            {"task": "t", "depends_on": [Ref(1), Ref(-1)]},
        ]
    )
    order = []
    for _ in range(4):
        leases = _claim_ids(client)
        order.append(sorted(leases))
        for lease in leases.values():
            assert client.complete(lease)
    assert order == [[a], [b, c], [d], []]


@pytest.mark.parametrize(
    "depends_on",
    [[Ref(0)], [Ref(1)], [Ref(-1)], [10**12]],
    ids=["self", "later item", "before the first", "unknown id"],
)
def test_cycles_and_unknown_ids_are_refused_and_store_nothing(
    client: leaseq.Client, dsn: str, schema: str, depends_on: list[object]
) -> None:
    with pytest.raises(leaseq.ConfigError):
        client.enqueue_many([{"task": "t", "depends_on": depends_on}, {"task": "t"}])
    assert rows(dsn, "SELECT count(*) FROM {s}.jobs", schema)[0][0] == 0
    assert rows(dsn, "SELECT count(*) FROM {s}.job_deps", schema)[0][0] == 0


def test_unknown_id_in_a_single_enqueue_stores_nothing(
    client: leaseq.Client, dsn: str, schema: str
) -> None:
    parent = client.enqueue("t")
    with pytest.raises(leaseq.ConfigError, match="do not exist"):
        client.enqueue("t", depends_on=[parent, parent + 1000])
    assert rows(dsn, "SELECT count(*) FROM {s}.jobs", schema)[0][0] == 1


@pytest.mark.parametrize("policy", ["cancel", "run", "ignore"])
def test_dead_dependency_under_each_policy(client: leaseq.Client, policy: str) -> None:
    parent = client.enqueue("t", max_attempts=1)
    child = client.enqueue("t", depends_on=[parent], on_dead=policy)
    grandchild = client.enqueue("t", depends_on=[child])
    (lease,) = _claim_ids(client).values()
    assert client.fail(lease, "BOOM", retryable=False)
    assert _status(client, parent) is JobStatus.DEAD
    if policy == "cancel":
        job = client.get_job(child)
        assert job.status is JobStatus.CANCELLED
        assert job.last_error_code == "DEPENDENCY_FAILED"
        assert "dependency_failed" in _events(client, child)
        # The cancellation is itself an ending: the grandchild is decided down the graph.
        assert _status(client, grandchild) is JobStatus.CANCELLED
        assert _claim_ids(client) == {}
    else:
        assert set(_claim_ids(client)) == {child}


def test_per_edge_policy_overrides_the_jobs(client: leaseq.Client) -> None:
    bad = client.enqueue("t", max_attempts=1)
    good = client.enqueue("t")
    child = client.enqueue("t", depends_on=[Dep(bad, on_dead="run"), good])
    leases = _claim_ids(client)
    assert client.fail(leases[bad], "BOOM", retryable=False)
    assert _status(client, child) is JobStatus.PENDING
    assert _claim_ids(client) == {}, "promoted before its other dependency ended"
    assert client.complete(leases[good])
    assert set(_claim_ids(client)) == {child}


def test_replay_with_dependents_brings_back_what_the_dead_parent_cancelled(
    client: leaseq.Client, dsn: str, schema: str
) -> None:
    parent = client.enqueue("t", max_attempts=1)
    child = client.enqueue("t", depends_on=[parent])
    grandchild = client.enqueue("t", depends_on=[child])
    (lease,) = _claim_ids(client).values()
    client.fail(lease, "BOOM", retryable=False)
    assert _status(client, grandchild) is JobStatus.CANCELLED
    assert client.replay(parent, reason="fixed", with_dependents=True)
    for job_id in (child, grandchild):
        assert _status(client, job_id) is JobStatus.PENDING
        assert _waiting(dsn, schema, job_id)
        assert _events(client, job_id)[-1] == "replayed"
    (lease,) = _claim_ids(client).values()
    assert lease.job_id == parent
    client.complete(lease)
    (lease,) = _claim_ids(client).values()
    assert lease.job_id == child


def test_replay_without_dependents_leaves_them_cancelled(client: leaseq.Client) -> None:
    parent = client.enqueue("t", max_attempts=1)
    child = client.enqueue("t", depends_on=[parent])
    (lease,) = _claim_ids(client).values()
    client.fail(lease, "BOOM", retryable=False)
    assert client.replay(parent, reason="fixed")
    assert _status(client, child) is JobStatus.CANCELLED


def test_dependent_enqueued_after_the_claim_is_promoted_by_the_completion(
    client: leaseq.Client, dsn: str, schema: str
) -> None:
    """The lease says "no dependents" (claimed before the child existed): the plain
    completion must not take the row, or the child would wait forever."""
    parent = client.enqueue("t")
    (lease,) = _claim_ids(client).values()
    assert not lease.has_dependents
    child = client.enqueue("t", depends_on=[parent])
    assert client.complete(lease)
    assert not _waiting(dsn, schema, child)
    assert set(_claim_ids(client)) == {child}


def test_dependency_already_finished_at_enqueue(client: leaseq.Client) -> None:
    parent = client.enqueue("t")
    client.complete(next(iter(_claim_ids(client).values())))
    child = client.enqueue("t", depends_on=[parent])
    assert set(_claim_ids(client)) == {child}


def test_stale_completion_promotes_nothing(client: leaseq.Client, dsn: str, schema: str) -> None:
    parent = client.enqueue("t")
    child = client.enqueue("t", depends_on=[parent])
    (stale,) = _claim_ids(client).values()
    expire_lease(dsn, schema, parent)
    client.sweep()
    rows(dsn, "UPDATE {s}.jobs SET available_at = now() WHERE id = %s RETURNING 1", schema, parent)
    (fresh,) = _claim_ids(client).values()
    assert not client.complete(stale)
    assert _waiting(dsn, schema, child)
    assert client.complete(fresh)
    assert not _waiting(dsn, schema, child)


def test_sweeper_dead_parent_cancels_its_dependent(
    client: leaseq.Client, dsn: str, schema: str
) -> None:
    parent = client.enqueue("t", max_attempts=1)
    child = client.enqueue("t", depends_on=[parent])
    _claim_ids(client)
    expire_lease(dsn, schema, parent)
    client.sweep()
    assert _status(client, parent) is JobStatus.DEAD
    assert _status(client, child) is JobStatus.CANCELLED


def test_cancelling_a_pending_dependency_cancels_its_dependent(client: leaseq.Client) -> None:
    parent = client.enqueue("t")
    child = client.enqueue("t", depends_on=[parent])
    assert client.cancel(parent)
    assert _status(client, child) is JobStatus.CANCELLED


def _complete_and_commit(
    client: leaseq.Client,
    lease: leaseq.Lease,
    conn: psycopg.Connection[tuple[object, ...]],
    done: threading.Event,
) -> None:
    assert client.complete(lease, connection=conn)
    conn.commit()
    done.set()


def test_two_dependencies_ending_at_once_leave_no_dependent_waiting(
    client: leaseq.Client, dsn: str, schema: str
) -> None:
    """Two fenced completions in two open transactions: each decides the shared child
    after locking it, so the later one sees the earlier one's commit."""
    for _ in range(5):
        p1, p2 = client.enqueue("t"), client.enqueue("t")
        child = client.enqueue("t", depends_on=[p1, p2])
        leases = _claim_ids(client)
        with (
            psycopg.connect(dsn) as c1,
            psycopg.connect(dsn) as c2,
        ):
            assert client.complete(leases[p1], connection=c1)  # open transaction
            done = threading.Event()

            thread = threading.Thread(
                target=_complete_and_commit, args=(client, leases[p2], c2, done)
            )
            thread.start()
            time.sleep(0.1)
            assert not done.is_set(), "the second completion did not wait for the child lock"
            c1.commit()
            thread.join(10)
            assert done.is_set()
        assert not _waiting(dsn, schema, child)
        (lease,) = _claim_ids(client).values()
        assert lease.job_id == child
        client.complete(lease)


def test_combining_dependencies_with_keys_is_refused(client: leaseq.Client) -> None:
    parent = client.enqueue("t")
    with pytest.raises(leaseq.ConfigError, match="cannot be combined"):
        client.enqueue("t", depends_on=[parent], ordering_key="k")
    with pytest.raises(leaseq.ConfigError, match="on_dead"):
        client.enqueue("t", depends_on=[parent], on_dead="explode")


def test_replayed_dependent_waits_again_for_an_unfinished_dependency(
    client: leaseq.Client, dsn: str, schema: str
) -> None:
    parent = client.enqueue("t")
    child = client.enqueue("t", depends_on=[parent])
    assert client.cancel(child)
    assert client.replay(child, reason="again", allow_cancelled=True)
    assert _waiting(dsn, schema, child)
    (lease,) = _claim_ids(client).values()
    assert lease.job_id == parent
    client.complete(lease)
    assert set(_claim_ids(client)) == {child}


def test_waiting_jobs_are_exported_as_metrics(client: leaseq.Client) -> None:
    from leaseq.db_metrics import DatabaseCollector

    parent = client.enqueue("t")
    client.enqueue("t", depends_on=[parent])
    client.enqueue("t", depends_on=[parent])
    health = client.database_health()
    assert health["waiting_jobs"] == 2 and health["oldest_wait"] >= 0
    families = {
        m.name: m.samples[0].value
        for m in DatabaseCollector(lambda: (client.queue_stats(), health)).collect()
        if m.samples
    }
    assert families["leaseq_jobs_waiting_on_dependencies"] == 2
    assert families["leaseq_oldest_dependency_wait_seconds"] == health["oldest_wait"]


def test_waiting_jobs_are_not_counted_ready(client: leaseq.Client) -> None:
    parent = client.enqueue("t")
    client.enqueue("t", depends_on=[parent])
    (stats,) = client.queue_stats()
    assert (stats.ready, stats.scheduled) == (1, 0)


def test_a_retried_dependency_promotes_nothing_until_it_ends(
    client: leaseq.Client, dsn: str, schema: str
) -> None:
    """Retries are not endings (Celery's chords counted them): the child waits through
    every failed attempt and is promoted once, by the success."""
    parent = client.enqueue("t", max_attempts=3)
    child = client.enqueue("t", depends_on=[parent])
    for _ in range(2):
        (lease,) = _claim_ids(client).values()
        assert client.fail(lease, "FLAKY", retry_in=0)
        assert _waiting(dsn, schema, child)
        rows(
            dsn,
            "UPDATE {s}.jobs SET available_at = now() WHERE id = %s RETURNING 1",
            schema,
            parent,
        )
    (lease,) = _claim_ids(client).values()
    assert lease.job_id == parent and client.complete(lease)
    assert set(_claim_ids(client)) == {child}
    assert _events(client, child) == ["promoted"]


def test_dependents_enqueued_while_their_dependencies_complete_are_never_stranded(
    client: leaseq.Client, dsn: str, schema: str
) -> None:
    """Enqueues of dependents race the completions of their dependencies (two clients, two
    threads): whichever commits first, no dependent is left waiting on ended jobs."""
    with leaseq.Client(dsn, schema=schema) as a, leaseq.Client(dsn, schema=schema) as b:
        parents = [int(i) for i in a.enqueue_many([{"task": "p"} for _ in range(60)])]
        leases = a.claim(worker="w", limit=60)
        assert len(leases) == 60
        children: list[int] = []

        def complete_all() -> None:
            for lease in leases:
                assert a.complete(lease)

        def enqueue_all() -> None:
            for i, parent in enumerate(parents):
                deps = [parent, parents[(i + 7) % len(parents)]]
                children.append(int(b.enqueue("c", depends_on=deps)))

        threads = [threading.Thread(target=complete_all), threading.Thread(target=enqueue_all)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert len(children) == 60
        assert rows(dsn, "SELECT count(*) FROM {s}.jobs WHERE waiting", schema) == [(0,)]
        assert len(a.claim(worker="w", limit=100)) == 60


def test_dependent_enqueued_after_the_claim_is_decided_by_the_failure(
    client: leaseq.Client,
) -> None:
    """As above for a failure that ends the job dead: the plain fail statement must leave
    the row to the coordinated one, which cancels the dependent."""
    parent = client.enqueue("t", max_attempts=1)
    (lease,) = _claim_ids(client).values()
    child = client.enqueue("t", depends_on=[parent])
    assert client.fail(lease, "BOOM", retryable=False)
    assert _status(client, child) is JobStatus.CANCELLED
