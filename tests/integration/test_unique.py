"""Unique jobs on a real PostgreSQL: the key is taken in the enqueue statement, and every
transition that ends or revives a keyed job updates who holds the key in the same statement.
Each test names the boundary it breaks and the invariant that must survive it."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
from typing import Any

import psycopg
import pytest

import leaseq
from leaseq import ConfigError, JobStatus, ReplayRefused, UniqueConflict
from tests.support.helpers import expire_lease, rows, run_sql
from tests.support.procs import ROOT

FAST = leaseq.RetryPolicy(base=0.001, cap=0.01)


def _holder(dsn: str, schema: str, key: str) -> tuple[Any, ...] | None:
    found = rows(
        dsn, "SELECT job_id, held_until FROM {s}.unique_keys WHERE unique_key = %s", schema, key
    )
    return found[0] if found else None


def _live(dsn: str, schema: str, key: str) -> list[int]:
    found = rows(
        dsn,
        "SELECT id FROM {s}.jobs WHERE unique_key = %s AND status IN ('pending', 'running')"
        " ORDER BY id",
        schema,
        key,
    )
    return [r[0] for r in found]


def _events(client: leaseq.Client, job_id: int) -> list[str]:
    return [e.event for e in client.job_events(job_id)]


def test_a_held_key_returns_the_holder_and_stores_nothing(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    first = client.enqueue("t", {"n": 1}, unique_key="k")
    assert first.inserted and not first.existing and first.outcome is None
    again = client.enqueue("t", {"n": 2}, unique_key="k")
    assert int(again) == int(first)
    assert again.existing and not again.inserted and again.conflict_state == "pending"
    assert _live(dsn, schema, "k") == [first]
    with pytest.raises(UniqueConflict, match=f"held by job {int(first)} \\(pending\\)"):
        client.enqueue("t", {"n": 3}, unique_key="k", on_conflict="raise")
    job = client.get_job(first)
    assert job is not None and job.payload == {"n": 1} and job.unique_key == "k"
    assert client.unique_conflicts == {"skip": 1, "raise": 1}


def test_raise_leaves_the_callers_transaction_usable(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    holder = client.enqueue("t", unique_key="k")
    with client.connection() as conn, conn.transaction():
        with pytest.raises(UniqueConflict):
            client.enqueue("t", unique_key="k", on_conflict="raise", connection=conn)
        other = client.enqueue("t", unique_key="other", connection=conn)
    assert _holder(dsn, schema, "other") == (other, None)
    assert _holder(dsn, schema, "k") == (holder, None)


def test_replace_updates_a_pending_holder_only(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    first = client.enqueue("t", {"v": 1}, unique_key="k", priority=1)
    replaced = client.enqueue("t", {"v": 2}, unique_key="k", on_conflict="replace", priority=5)
    assert int(replaced) == int(first) and replaced.replaced and not replaced.inserted
    job = client.get_job(first)
    assert job is not None and job.payload == {"v": 2} and job.priority == 5
    assert "unique_replaced" in _events(client, first)


def test_replace_while_the_holder_runs_queues_a_follow_up_and_never_touches_it(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    first = client.enqueue("t", {"v": 1}, unique_key="k")
    (lease,) = client.claim("default", worker="w")
    follow = client.enqueue("t", {"v": 2}, unique_key="k", on_conflict="replace")
    assert follow.inserted and follow.outcome == "follow_up" and follow.conflict_state == "running"
    assert int(follow) != int(first)
    running = client.get_job(first)
    assert running is not None and running.payload == {"v": 1}
    assert running.status is JobStatus.RUNNING and running.lease_token == lease.token
    assert _holder(dsn, schema, "k") == (int(follow), None)
    # A further replace coalesces into the (pending) follow-up: no update is lost.
    again = client.enqueue("t", {"v": 3}, unique_key="k", on_conflict="replace")
    assert int(again) == int(follow) and again.replaced
    # The superseded holder finishing does not release the follow-up's key.
    assert client.complete(lease)
    assert _holder(dsn, schema, "k") == (int(follow), None)
    assert "superseded" in _events(client, first)


def test_completion_releases_the_key_and_a_window_keeps_it(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    plain = client.enqueue("t", unique_key="plain")
    windowed = client.enqueue("t", unique_key="win", unique_for=3600)
    leases = client.claim("default", worker="w", limit=2)
    assert {lease.unique_key for lease in leases} == {"plain", "win"}
    assert client.complete_many(leases) == {int(plain), int(windowed)}
    assert _holder(dsn, schema, "plain") is None
    held = _holder(dsn, schema, "win")
    assert held is not None and held[0] == windowed and held[1] is not None
    again = client.enqueue("t", unique_key="win")
    assert int(again) == int(windowed) and again.conflict_state == "succeeded"
    assert client.enqueue("t", unique_key="plain").inserted


def test_a_window_survives_prune_and_purge_and_ends_on_time(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    done = client.enqueue("t", unique_key="a", unique_for=3600)
    client.enqueue(
        "t", unique_key="b", unique_for=3600, unique_states=["pending", "running", "dead"]
    )
    for lease in client.claim("default", worker="w", limit=2):
        if lease.job_id == done:
            assert client.complete(lease)
        else:
            assert client.fail(lease, "BOOM", retryable=False)
    run_sql(dsn, "UPDATE {s}.jobs SET finished_at = now() - interval '2 hours'", schema)
    assert client.prune(older_than=60) == 1
    assert client.purge_dead(reason="cleanup") == 1
    assert rows(dsn, "SELECT count(*) FROM {s}.jobs", schema) == [(0,)]
    refused = client.enqueue("t", unique_key="a")
    assert refused.existing and int(refused) == int(done) and refused.conflict_state == "finished"
    assert client.enqueue("t", unique_key="b").conflict_state == "finished"
    # The windows end: the next enqueue takes each key over.
    run_sql(dsn, "UPDATE {s}.unique_keys SET held_until = now() - interval '1 second'", schema)
    assert client.enqueue("t", unique_key="a").inserted
    client.sweep()
    assert _holder(dsn, schema, "b") is None  # the sweep deleted the ended window
    assert client.enqueue("t", unique_key="b").inserted


def test_fifty_concurrent_transactions_store_exactly_one_job(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    barrier = threading.Barrier(50)
    results: list[leaseq.EnqueueResult] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def enqueue(i: int) -> None:
        try:
            with psycopg.connect(dsn) as conn:
                barrier.wait()
                result = client.enqueue("t", {"i": i}, unique_key="one", connection=conn)
                conn.commit()
            with lock:
                results.append(result)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=enqueue, args=(i,)) for i in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert rows(dsn, "SELECT count(*) FROM {s}.jobs", schema) == [(1,)]
    assert sum(r.inserted for r in results) == 1
    assert len({int(r) for r in results}) == 1


def test_a_rolled_back_winner_leaves_the_key_to_the_waiting_enqueue(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    winner = psycopg.connect(dsn)
    try:
        client.enqueue("t", {"who": "winner"}, unique_key="k", connection=winner)
        result: list[leaseq.EnqueueResult] = []

        def waiting() -> None:
            with psycopg.connect(dsn) as conn:
                result.append(
                    client.enqueue("t", {"who": "waiter"}, unique_key="k", connection=conn)
                )
                conn.commit()

        thread = threading.Thread(target=waiting)
        thread.start()
        thread.join(0.3)
        assert thread.is_alive()  # waits on the winner's uncommitted key
        winner.rollback()
        thread.join(10)
    finally:
        winner.close()
    assert result and result[0].inserted
    job = client.get_job(result[0])
    assert job is not None and job.payload == {"who": "waiter"}
    assert _holder(dsn, schema, "k") == (int(result[0]), None)


def test_a_superseded_job_that_fails_is_cancelled_not_retried(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    client.retry_policy = FAST
    first = client.enqueue("t", {"v": 1}, unique_key="k")
    (lease,) = client.claim("default", worker="w")
    follow = client.enqueue("t", {"v": 2}, unique_key="k", on_conflict="replace")
    assert client.fail(lease, "FLAKY")  # would be retried
    job = client.get_job(first)
    assert job is not None and job.status is JobStatus.CANCELLED
    assert job.last_error_code == "SUPERSEDED"
    trail = client.job_events(first)
    assert trail[-1].event == "cancelled" and f"job {int(follow)}" in (trail[-1].detail or "")
    assert _live(dsn, schema, "k") == [int(follow)]
    assert _holder(dsn, schema, "k") == (int(follow), None)


def test_a_retry_keeps_its_own_key(dsn: str, schema: str, client: leaseq.Client) -> None:
    client.retry_policy = FAST
    first = client.enqueue("t", unique_key="k")
    (lease,) = client.claim("default", worker="w")
    assert client.fail(lease, "FLAKY")
    assert client.get_job(first).status is JobStatus.PENDING  # type: ignore[union-attr]
    assert _holder(dsn, schema, "k") == (int(first), None)
    assert client.enqueue("t", unique_key="k").existing


def test_sweep_requeues_a_holder_and_cancels_a_superseded_one(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    a = client.enqueue("t", unique_key="a")
    b = client.enqueue("t", unique_key="b")
    leases = {lease.job_id: lease for lease in client.claim("default", worker="w", limit=2)}
    follow = client.enqueue("t", unique_key="b", on_conflict="replace")
    expire_lease(dsn, schema, a)
    expire_lease(dsn, schema, b)
    result = client.sweep()
    assert (result.requeued, result.cancelled) == (1, 1)
    assert _holder(dsn, schema, "a") == (int(a), None)
    assert _holder(dsn, schema, "b") == (int(follow), None)
    job_b = client.get_job(b)
    assert job_b is not None and job_b.last_error_code == "SUPERSEDED"
    # The stale worker can neither finish nor release anything.
    assert not client.complete(leases[a]) and not client.complete(leases[b])
    assert _holder(dsn, schema, "b") == (int(follow), None)


def test_sweep_to_dead_releases_the_key(dsn: str, schema: str, client: leaseq.Client) -> None:
    job = client.enqueue("t", unique_key="k", max_attempts=1)
    client.claim("default", worker="w")
    expire_lease(dsn, schema, job)
    assert client.sweep().dead == 1
    assert _holder(dsn, schema, "k") is None


def test_replay_meeting_a_live_duplicate_is_refused_and_audited(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    dead = client.enqueue("t", unique_key="k")
    (lease,) = client.claim("default", worker="w")
    assert client.fail(lease, "BOOM", retryable=False)
    assert _holder(dsn, schema, "k") is None
    live = client.enqueue("t", unique_key="k")
    assert live.inserted
    with pytest.raises(ReplayRefused, match=f"held by job {int(live)}"):
        client.replay(dead, reason="fixed")
    job = client.get_job(dead)
    assert job is not None and job.status is JobStatus.DEAD
    refusal = client.job_events(dead)[-1]
    assert refusal.event == "replay_refused" and f"job {int(live)}" in (refusal.detail or "")
    # Once the duplicate is gone, the replay takes the key back.
    assert client.cancel(live)
    assert client.replay(dead, reason="fixed")
    assert _holder(dsn, schema, "k") == (int(dead), None)


def test_bulk_replay_counts_refusals_and_goes_on(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    ids = [client.enqueue("t", unique_key=f"k{i % 3}") for i in range(3)]
    ids += [client.enqueue("t", unique_key="free")]
    for lease in client.claim("default", worker="w", limit=10):
        assert client.fail(lease, "BOOM", retryable=False)
    live = client.enqueue("t", unique_key="k0")
    # Two dead jobs of one key in one batch: the first takes it, the second is refused.
    extra = client.enqueue("t", unique_key="k1", queue="other")
    (lease,) = client.claim("other", worker="w")
    assert lease.job_id == extra and client.fail(lease, "BOOM", retryable=False)
    result = client.replay_many(reason="fixed", batch_size=2)
    assert [e.event for e in client.job_events(extra)][-1] == "replay_refused"
    assert int(result) == 3  # k1 (first), k2, free
    assert sorted(result.refused) == sorted([(ids[0], int(live)), (extra, ids[1])])
    assert _live(dsn, schema, "k1") == [ids[1]]
    for key in ("k0", "k1", "k2", "free"):
        assert len(_live(dsn, schema, key)) == 1


def test_cancel_of_a_pending_holder_lets_the_key_go(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    job = client.enqueue("t", unique_key="k")
    assert client.cancel(job)
    assert _holder(dsn, schema, "k") is None
    kept = client.enqueue(
        "t", unique_key="w", unique_for=60, unique_states=["pending", "running", "cancelled"]
    )
    assert client.cancel(kept)
    assert client.enqueue("t", unique_key="w").existing


def test_keys_skip_revives_nothing_so_it_cannot_conflict(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    head = client.enqueue("t", unique_key="u", ordering_key="o")
    (lease,) = client.claim("default", worker="w")
    assert client.fail(lease, "BOOM", retryable=False)
    live = client.enqueue("t", unique_key="u", ordering_key="o")
    assert live.inserted
    assert client.skip_dead_head(head, reason="poison")
    assert client.get_job(head).status is JobStatus.DEAD  # type: ignore[union-attr]
    assert _holder(dsn, schema, "u") == (int(live), None)


def test_enqueue_many_resolves_duplicates_to_the_first_item(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    results = client.enqueue_many(
        [
            {"task": "t", "payload": 1, "unique_key": "a"},
            {"task": "t", "payload": 2},
            {"task": "t", "payload": 3, "unique_key": "a"},
            leaseq.JobSpec("t", 4, unique_key="b"),
        ]
    )
    assert len(results) == 4
    assert int(results[2]) == int(results[0]) and results[2].existing
    assert results[0].inserted and results[1].inserted and results[3].inserted
    assert rows(dsn, "SELECT count(*) FROM {s}.jobs", schema) == [(3,)]


def test_debounce_collapses_a_burst_and_never_passes_its_cap(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    results = [
        client.enqueue("t", {"n": i}, unique_key="d", debounce=30, debounce_max=60)
        for i in range(100)
    ]
    assert len({int(r) for r in results}) == 1
    ((count, payload, after_now, within_cap, cap_ok),) = rows(
        dsn,
        "SELECT count(*), max(payload::text), bool_and(available_at > now() + interval '29s'),"
        " bool_and(available_at <= debounce_until),"
        " bool_and(debounce_until <= created_at + interval '60s') FROM {s}.jobs",
        schema,
    )
    assert (count, payload, after_now, within_cap, cap_ok) == (1, '{"n": 99}', True, True, True)
    # Near the cap, a later debounce is clamped to it.
    run_sql(dsn, "UPDATE {s}.jobs SET debounce_until = now() + interval '5s'", schema)
    client.enqueue("t", {"n": 100}, unique_key="d", debounce=30, debounce_max=60)
    ((clamped,),) = rows(dsn, "SELECT available_at = debounce_until FROM {s}.jobs", schema)
    assert clamped


def test_a_debounce_arriving_while_leased_queues_a_follow_up(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    first = client.enqueue("t", {"n": 1}, unique_key="d", debounce=0.001)
    run_sql(dsn, "UPDATE {s}.jobs SET available_at = now()", schema)
    (lease,) = client.claim("default", worker="w")
    follow = client.enqueue("t", {"n": 2}, unique_key="d", debounce=5, debounce_max=10)
    assert follow.outcome == "follow_up" and int(follow) != int(first)
    job = client.get_job(follow)
    assert job is not None and job.payload == {"n": 2} and job.status is JobStatus.PENDING
    assert client.get_job(first).payload == {"n": 1}  # type: ignore[union-attr]
    assert client.complete(lease)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"unique_for": 5}, "needs a unique_key"),
        ({"unique_key": "k", "unique_states": ["pending"]}, "must contain pending and running"),
        (
            {"unique_key": "k", "unique_states": ["pending", "running", "dead"]},
            "no unique_for",
        ),
        ({"unique_key": "k", "on_conflict": "merge"}, "on_conflict must be"),
        ({"unique_key": "k", "debounce": 1, "on_conflict": "skip"}, "contradicts"),
        ({"unique_key": "k", "debounce": 1, "delay": 3}, "no run_at or delay"),
        ({"unique_key": "x" * 201}, "unique_key must be"),
    ],
)
def test_bad_unique_options_store_nothing(
    dsn: str, schema: str, client: leaseq.Client, options: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        client.enqueue("t", **options)
    assert rows(dsn, "SELECT count(*) FROM {s}.jobs", schema) == [(0,)]
    assert rows(dsn, "SELECT count(*) FROM {s}.unique_keys", schema) == [(0,)]


def _cli(dsn: str, schema: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, LEASEQ_DSN=dsn, LEASEQ_SCHEMA=schema)
    return subprocess.run(
        [sys.executable, "-m", "leaseq", *args],
        env=env,
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )


def test_cli_enqueue_with_a_unique_key_and_jobs_show(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    first = _cli(dsn, schema, "enqueue", "t", "{}", "--unique-key", "k", "--unique-for", "1h")
    assert first.returncode == 0, first.stderr
    job_id = int(first.stdout)
    again = _cli(dsn, schema, "enqueue", "t", "--unique-key", "k")
    assert again.returncode == 0 and int(again.stdout) == job_id
    assert f"held by job {job_id} (pending)" in again.stderr
    refused = _cli(dsn, schema, "enqueue", "t", "--unique-key", "k", "--on-conflict", "raise")
    assert refused.returncode != 0 and refused.stderr.count("\n") == 1
    assert f"held by job {job_id}" in refused.stderr
    bad = _cli(dsn, schema, "enqueue", "t", "--unique-key", "k", "--unique-state", "dead")
    assert bad.returncode != 0 and "Traceback" not in bad.stderr
    shown = _cli(dsn, schema, "jobs", "show", str(job_id))
    assert "unique key: k — held by this job" in shown.stdout, shown.stderr
    assert rows(dsn, "SELECT count(*) FROM {s}.jobs", schema) == [(1,)]
    # A replay refused because a live duplicate holds the key: one line, non-zero, audited.
    (lease,) = client.claim("default", worker="w")
    assert client.fail(lease, "BOOM", retryable=False)
    live = client.enqueue("t", unique_key="k")
    assert live.inserted  # dead is not in the default states: the key was let go
    replay = _cli(dsn, schema, "replay", str(job_id), "--reason", "fixed")
    assert replay.returncode != 0 and replay.stderr.count("\n") == 1, replay.stderr
    assert f"refused: unique key 'k' is held by job {int(live)}" in replay.stderr
    assert client.job_events(job_id)[-1].event == "replay_refused"


def test_a_debounced_burst_runs_once_after_the_quiet_period_within_its_cap(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    app = leaseq.App(dsn, schema=schema, retry_policy=FAST)
    runs: list[Any] = []

    @app.task(name="rebuild")
    def rebuild(ctx: leaseq.JobContext, payload: Any) -> None:
        runs.append(payload)

    for i in range(100):
        app.client.enqueue("rebuild", {"n": i}, unique_key="index", debounce=0.3, debounce_max=5)
    config = leaseq.WorkerConfig(poll_interval=0.02, drain=True, concurrency=4)
    asyncio.run(leaseq.Worker(app, config).run())
    assert runs == [{"n": 99}]  # once, with the last payload
    # Database times only: it started after the quiet period that followed the last
    # enqueue, and its start was never pushed past first enqueue + debounce_max.
    ((quiet, capped),) = rows(
        dsn,
        "SELECT started_at >= available_at AND available_at >= (SELECT max(at) FROM "
        "{s}.job_events WHERE event = 'unique_replaced') + interval '0.3 s', "
        "available_at <= debounce_until AND debounce_until <= created_at + interval '5 s' "
        "FROM {s}.jobs",
        schema,
    )
    assert quiet and capped
    assert rows(
        dsn, "SELECT count(*) FROM {s}.job_events WHERE event = 'unique_replaced'", schema
    ) == [(99,)]
    app.client.close()


def test_a_conflict_in_an_open_transaction_does_not_hold_up_the_holders_completion(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    """Boundary: a caller's transaction that met a held key and stays open. Invariant: it
    locks nothing of the key, so the holder's completion (a worker's batch) goes through."""
    client.enqueue("t", unique_key="k")
    (lease,) = client.claim("default", worker="w")
    with psycopg.connect(dsn) as caller:
        assert client.enqueue("t", unique_key="k", connection=caller).existing
        done: list[bool] = []
        thread = threading.Thread(target=lambda: done.append(client.complete(lease)))
        thread.start()
        thread.join(5)
        completed_while_open = list(done)
        caller.rollback()  # lets a blocked completion go, so a failure cannot hang
        thread.join(10)
    assert completed_while_open == [True]
    assert _holder(dsn, schema, "k") is None


def test_task_enqueue_takes_the_unique_options(dsn: str, schema: str) -> None:
    app = leaseq.App(dsn, schema=schema)
    app.client.migrate()

    @app.task(name="sync_account", queue="sync", priority=3)
    def sync_account(ctx: leaseq.JobContext, payload: Any) -> None:
        pass

    first = sync_account.enqueue({"id": 1}, unique_key="acct:1", unique_for=60)
    again = sync_account.enqueue({"id": 1}, unique_key="acct:1")
    assert first.inserted and again.existing and int(again) == int(first)
    job = app.client.get_job(first)
    assert job is not None and (job.queue, job.priority, job.unique_key) == ("sync", 3, "acct:1")
    assert app.unique_conflicts() == {"skip": 1}
    app.client.close()


def test_replaces_racing_claims_lose_no_update(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    """Boundary: replace enqueues racing claims and completions of the key's holder (the
    replace's status fence against the claim's row lock). Invariant: no update is lost (the
    last payload enqueued runs), a running job is never changed (each run sees the payload
    it was claimed with, recorded by the claim), and the key always has one holder."""
    done = threading.Event()
    ran: list[tuple[int, Any]] = []
    errors: list[BaseException] = []

    def consume(worker: str) -> None:
        try:
            while True:
                leases = client.claim(worker=worker, limit=1)
                for lease in leases:
                    ran.append((lease.job_id, lease.payload))
                    job = client.get_job(lease.job_id)
                    assert job is not None and job.payload == lease.payload
                    assert client.complete(lease)
                if not leases and done.is_set() and not _live(dsn, schema, "k"):
                    return
        except BaseException as exc:
            errors.append(exc)

    consumers = [threading.Thread(target=consume, args=(f"w{i}",)) for i in range(2)]
    for t in consumers:
        t.start()
    for n in range(150):
        client.enqueue("t", {"n": n}, unique_key="k", on_conflict="replace")
    done.set()
    for t in consumers:
        t.join(60)
    assert not errors, errors
    assert max(payload["n"] for _, payload in ran) == 149
    assert len({job_id for job_id, _ in ran}) == len(ran)  # each job ran once
    assert _holder(dsn, schema, "k") is None and not _live(dsn, schema, "k")


def test_a_follow_up_with_the_same_ordering_key_waits_for_the_superseded_run(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    first = client.enqueue("t", {"v": 1}, unique_key="k", ordering_key="k")
    (lease,) = client.claim(worker="w")
    follow = client.enqueue("t", {"v": 2}, unique_key="k", ordering_key="k", on_conflict="replace")
    assert follow.outcome == "follow_up"
    assert client.claim(worker="w") == []  # blocked behind the running job of its key
    assert client.complete(lease) and lease.job_id == first
    (next_lease,) = client.claim(worker="w")
    assert next_lease.job_id == int(follow) and next_lease.payload == {"v": 2}
    assert client.complete(next_lease)
    assert _holder(dsn, schema, "k") is None
