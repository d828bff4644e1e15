"""Job cost on a real PostgreSQL (docs/limits.md, "Job cost"): a job of cost N takes N
units (slot numbers) of every concurrency limit that applies, in the claim statement, under
the limits' unique constraints, and every statement that ends its lease gives all of them
back. Each test names the boundary it breaks and the invariant that must survive it."""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

import psycopg
import pytest

import leaseq
from leaseq import ConfigError, JobStatus
from leaseq.workflows import callback_spec
from tests.support.helpers import expire_lease, rows

FAST = leaseq.RetryPolicy(base=0.001, cap=0.01)


def _units(dsn: str, schema: str) -> dict[str, int]:
    """Units held per limit name (both places: slot rows and queue slots on job rows)."""
    found = rows(dsn, "SELECT limit_name, count(*) FROM {s}.held_slots GROUP BY 1", schema)
    return {str(r[0]): int(r[1]) for r in found}


def _per_job(dsn: str, schema: str) -> dict[tuple[str, int], int]:
    found = rows(
        dsn, "SELECT limit_name, job_id, count(*) FROM {s}.held_slots GROUP BY 1, 2", schema
    )
    return {(str(r[0]), int(r[1])): int(r[2]) for r in found}


def _slot_rows_flag(dsn: str, schema: str, name: str) -> bool:
    found = rows(dsn, "SELECT queue_slot_rows FROM {s}.limits WHERE name = %s", schema, name)
    return bool(found[0][0])


def test_a_key_limit_admits_costs_in_claim_order_and_a_job_that_does_not_fit_holds_back_the_rest(
    client: leaseq.Client, dsn: str, schema: str
) -> None:
    # Boundary: the next job in claim order needs more units than are free. Invariant: it
    # is not skipped by smaller jobs behind it (they would starve it), and no job holds
    # fewer units than its cost.
    client.set_limit("key:gpu", concurrency=5)
    ids = [int(client.enqueue("t", i, limit_key="gpu", cost=c)) for i, c in enumerate([3, 3, 1])]
    first = client.claim(worker="w", limit=10)
    assert [lease.job_id for lease in first] == ids[:1]
    assert _per_job(dsn, schema) == {("key:gpu", ids[0]): 3}
    assert client.claim(worker="w", limit=10) == [], (
        "3 + 3 > 5: the second waits, so does the third"
    )
    assert client.complete(first[0])
    assert _units(dsn, schema) == {}
    second = client.claim(worker="w", limit=10)
    assert [lease.job_id for lease in second] == ids[1:]
    assert _per_job(dsn, schema) == {("key:gpu", ids[1]): 3, ("key:gpu", ids[2]): 1}
    for lease in second:
        assert client.complete(lease)
    assert _units(dsn, schema) == {}


def test_a_queue_limit_moves_its_slots_to_slot_rows_when_a_costly_job_comes_and_counts_both(
    client: leaseq.Client, dsn: str, schema: str
) -> None:
    # Boundary: jobs of cost 1 hold queue slots on their rows (the fast path) when a job of
    # cost 2 arrives. Invariant: the limit moves to slot rows (once) and the units held, in
    # both places, never exceed it; the numbers on job rows are passed over.
    client.set_limit("queue:q", concurrency=4)
    cheap = [int(client.enqueue("t", i, queue="q")) for i in range(2)]
    held = client.claim("q", worker="w", limit=2)
    assert sorted(lease.job_id for lease in held) == cheap
    assert not _slot_rows_flag(dsn, schema, "queue:q")
    big = [int(client.enqueue("t", i, queue="q", cost=2)) for i in range(2)]
    got = client.claim("q", worker="w", limit=5)
    assert [lease.job_id for lease in got] == big[:1], "2 + 2 of 4: one costly job fits"
    assert _slot_rows_flag(dsn, schema, "queue:q")
    assert _units(dsn, schema) == {"queue:q": 4}
    numbers = rows(dsn, "SELECT slot FROM {s}.held_slots WHERE limit_name = 'queue:q'", schema)
    assert sorted(int(r[0]) for r in numbers) == [1, 2, 3, 4], "each unit its own number"
    assert client.claim("q", worker="w", limit=5) == []
    for lease in held:
        assert client.complete(lease)
    (last,) = client.claim("q", worker="w", limit=5)
    assert last.job_id == big[1] and last.slot_rows
    assert _units(dsn, schema) == {"queue:q": 4}
    for lease in [*got, last]:
        assert client.complete(lease)
    assert _units(dsn, schema) == {}
    # From now on cost 1 jobs take slot rows too (never a number on a job row).
    more = [int(client.enqueue("t", i, queue="q")) for i in range(6)]
    taken = client.claim("q", worker="w", limit=6)
    assert len(taken) == 4 and all(lease.job_id in more for lease in taken)
    on_rows = rows(dsn, "SELECT count(*) FROM {s}.jobs WHERE queue_slot IS NOT NULL", schema)
    assert on_rows[0][0] == 0
    assert _units(dsn, schema) == {"queue:q": 4}


def test_a_cost_above_a_limits_concurrency_ends_the_job_dead_at_claim_with_why(
    client: leaseq.Client, dsn: str, schema: str
) -> None:
    # Boundary: a job that could never start under its limit. Invariant: it ends dead with
    # the reason (not pending forever, not a crashed claim), holding no unit; the claim's
    # other jobs are claimed as usual.
    client.set_limit("task:t", concurrency=2)
    big = int(client.enqueue("t", None, cost=3))
    small = int(client.enqueue("t", None, cost=2))
    got = client.claim(worker="w", limit=5)
    assert [lease.job_id for lease in got] == [small]
    job = client.get_job(big)
    assert job is not None and job.status is JobStatus.DEAD
    assert job.last_error_code == "COST_OVER_LIMIT"
    assert "cost 3 is above the concurrency 2 of limit task:t" in (job.last_error_detail or "")
    assert _per_job(dsn, schema) == {("task:t", small): 2}


@pytest.mark.parametrize(
    "how",
    [
        "complete",
        "fail_retry",
        "fail_dead",
        "release",
        "unique_complete",
        "cancel",
        "sweep",
        "suspend",
    ],
)
@pytest.mark.parametrize("limit", ["key:k", "queue:q"])
def test_each_end_of_a_lease_gives_back_exactly_the_jobs_units(
    client: leaseq.Client, dsn: str, schema: str, how: str, limit: str
) -> None:
    # Boundary: every statement that ends a lease, with a cost-3 job and a cost-1 job under
    # the same limit. Invariant: that statement frees the ended job's 3 units, all of them
    # and nothing of the other job's.
    client.set_limit(limit, concurrency=5)
    unique = "u" if how == "unique_complete" else None
    job = int(client.enqueue("t", None, queue="q", limit_key="k", cost=3, unique_key=unique))
    other = int(client.enqueue("t", None, queue="q", limit_key="k"))
    leases = {lease.job_id: lease for lease in client.claim("q", worker="w", limit=2)}
    assert _per_job(dsn, schema) == {(limit, job): 3, (limit, other): 1}
    lease = leases[job]
    if how in ("complete", "unique_complete"):
        assert client.complete(lease)
    elif how == "fail_retry":
        assert client.fail(lease, "X", retry_in=0)
    elif how == "fail_dead":
        assert client.fail(lease, "X", retryable=False)
    elif how == "release":
        assert client.release(lease)
    elif how == "cancel":
        client.cancel(job)
        assert _per_job(dsn, schema)[(limit, job)] == 3, "the lease still runs: held"
        assert client.fail(lease, "CANCELLED")
        assert client.get_job(job).status is JobStatus.CANCELLED  # type: ignore[union-attr]
    elif how == "sweep":
        expire_lease(dsn, schema, job)
        # The statement that ends expired leases, alone (the sweep's orphan-slot net aside).
        assert client.sweep(policies={"t": FAST}).requeued == 1
    else:
        outcome = client.wait_point(lease, record="nap", until=time.time() + 3600, signal=None)
        assert outcome[0] == "suspend"
        assert client.get_job(job).status is JobStatus.SUSPENDED  # type: ignore[union-attr]
    assert _per_job(dsn, schema) == {(limit, other): 1}, how
    assert client.complete(leases[other])
    assert _units(dsn, schema) == {}


def test_concurrent_claimers_with_mixed_costs_never_hold_more_units_than_a_limit(
    client: leaseq.Client, dsn: str, schema: str
) -> None:
    # Boundary: six claimers racing for the same units with costs 1..4 under a queue limit
    # and a key limit at once. Invariant: at every sampled instant (one statement, one
    # snapshot) each limit's units held are within it, each job holds its whole cost of
    # each, and everything is given back at the end.
    client.set_limit("queue:q", concurrency=6)
    client.set_limit("key:k", concurrency=5)
    costs = [1, 2, 1, 3, 1, 4, 2, 1]
    client.enqueue_many(
        [
            {"task": "t", "queue": "q", "cost": costs[i % len(costs)], "limit_key": "k"}
            for i in range(160)
        ]
    )
    bad: list[Any] = []
    peaks: Counter[str] = Counter()
    errors: list[BaseException] = []

    def claimer(n: int) -> None:
        c = leaseq.Client(dsn, schema=schema)
        try:
            for _ in range(40):
                for lease in c.claim("q", worker=f"w{n}", limit=3):
                    c.complete(lease)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            c.close()

    def sampler(stop: threading.Event) -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            while not stop.is_set():
                found = conn.execute(
                    f"SELECT h.limit_name, h.job_id, count(*), min(j.cost), min(j.status::text)"
                    f" FROM {schema}.held_slots AS h JOIN {schema}.jobs AS j ON j.id = h.job_id"
                    f" GROUP BY 1, 2"
                ).fetchall()
                per_limit: Counter[str] = Counter()
                for name, _job, n, cost, status in found:
                    per_limit[name] += n
                    if n != cost or status != "running":
                        bad.append((name, _job, n, cost, status))
                for name, n in per_limit.items():
                    peaks[name] = max(peaks[name], n)

    stop = threading.Event()
    watch = threading.Thread(target=sampler, args=(stop,))
    watch.start()
    workers = [threading.Thread(target=claimer, args=(n,)) for n in range(6)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    stop.set()
    watch.join()
    assert not errors
    assert not bad
    assert peaks["queue:q"] <= 6 and peaks["key:k"] <= 5
    assert peaks["key:k"] >= 3, "the sampler saw the limits in use"
    done = rows(dsn, "SELECT count(*) FROM {s}.jobs WHERE status = 'succeeded'", schema)
    assert done[0][0] > 20
    assert _units(dsn, schema) == {}


@pytest.mark.parametrize("bad", [0, -1, 1001, "3", 2.0, True])
def test_a_bad_cost_is_refused_in_one_line_and_stores_nothing(
    client: leaseq.Client, dsn: str, schema: str, bad: Any
) -> None:
    with pytest.raises(ConfigError, match="cost must be") as info:
        client.enqueue("t", None, cost=bad)
    assert "\n" not in str(info.value)
    with pytest.raises(ConfigError, match="cost must be"):
        client.enqueue_many([{"task": "t", "cost": bad}])
    assert rows(dsn, "SELECT count(*) FROM {s}.jobs", schema)[0][0] == 0


def test_a_tasks_cost_is_its_jobs_default_and_an_enqueue_may_override_it(
    client: leaseq.Client, dsn: str, schema: str
) -> None:
    app = leaseq.App(dsn, schema=schema)

    @app.task(name="render", cost=4)
    def render(ctx: leaseq.JobContext, payload: Any) -> None: ...

    a = int(render.enqueue({}))
    b = int(render.enqueue({}, cost=2))
    found = rows(dsn, "SELECT id, cost FROM {s}.jobs ORDER BY id", schema)
    assert [(int(r[0]), int(r[1])) for r in found] == [(a, 4), (b, 2)]
    with pytest.raises(ConfigError, match="cost must be"):
        app.task(name="bad", cost=0)(lambda ctx, payload: None)


def test_a_fair_queues_claim_takes_costs_through_the_same_admission(
    client: leaseq.Client, dsn: str, schema: str
) -> None:
    # Boundary: claim_fair_jobs (keys in turn) under a key limit with costs. Invariant: the
    # keys' heads in turn get their whole costs or nothing, within the limit.
    client.set_limit("key:k", concurrency=4)
    a = [
        int(client.enqueue("t", i, queue="f", fairness_key="A", limit_key="k", cost=3))
        for i in range(2)
    ]
    b = [int(client.enqueue("t", i, queue="f", fairness_key="B", limit_key="k")) for i in range(2)]
    got = client.claim("f", worker="w", limit=10)
    assert sorted(lease.job_id for lease in got) == sorted([a[0], b[0]])
    assert _per_job(dsn, schema) == {("key:k", a[0]): 3, ("key:k", b[0]): 1}
    for lease in got:
        assert client.complete(lease)
    assert _units(dsn, schema) == {}


def test_the_sql_apis_enqueue_takes_cost_by_name_and_refuses_a_bad_one(
    client: leaseq.Client, dsn: str, schema: str
) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        (job,) = conn.execute(f"SELECT {schema}.enqueue('t', cost => 3)").fetchone()  # type: ignore[misc]
        with pytest.raises(psycopg.Error, match="cost must be between 1 and 1000, got 0"):
            conn.execute(f"SELECT {schema}.enqueue('t', cost => 0)")
    assert client.get_job(int(job)).cost == 3  # type: ignore[union-attr]
    assert rows(dsn, "SELECT count(*) FROM {s}.jobs", schema)[0][0] == 1


def test_a_schedules_jobs_carry_its_cost_from_the_task_or_its_own(
    client: leaseq.Client, dsn: str, schema: str
) -> None:
    # Boundary: the tick path (tick_job inserts its job from the schedules row). Invariant:
    # the job has the schedule's cost: the task's default for a code schedule, its own for
    # a dynamic one; a bad one is refused and stores nothing.
    app = leaseq.App(dsn, schema=schema)

    @app.task(name="render", cost=4)
    def render(ctx: leaseq.JobContext, payload: Any) -> None: ...

    app.schedule("nightly", task=render, every=3600)
    app.schedule("light", task=render, every=3600, cost=1)
    assert client.sync_code_schedules(app.schedule_defs(), app.tasks, actor="w") == ([], [])
    added = client.schedule_add("dyn", task="t", every=3600, cost=2)
    assert added.definition.cost == 2
    changed = client.schedule_change("dyn", cost=3)
    assert changed.definition.cost == 3
    ids = {name: client.schedule_run_now(name) for name in ("nightly", "light", "dyn")}
    costs = {name: client.get_job(i).cost for name, i in ids.items()}  # type: ignore[union-attr]
    assert costs == {"nightly": 4, "light": 1, "dyn": 3}
    with pytest.raises(ConfigError, match="cost must be"):
        client.schedule_add("bad", task="t", every=3600, cost=0)
    assert [s.definition.name for s in client.schedules() if s.definition.name == "bad"] == []


def test_a_fair_queues_claim_moves_its_queue_limit_to_slot_rows_too(
    client: leaseq.Client, dsn: str, schema: str
) -> None:
    # Boundary: the first costly job under a queue limit is met by claim_fair_jobs (LQ011
    # from admit() inside it). Invariant: the limit moves, the fair claim goes on, units fit.
    client.set_limit("queue:f", concurrency=3)
    a = int(client.enqueue("t", None, queue="f", fairness_key="A", cost=2))
    b = int(client.enqueue("t", None, queue="f", fairness_key="B", cost=2))
    got = client.claim("f", worker="w", limit=10)
    assert len(got) == 1 and got[0].job_id in (a, b), "2 + 2 > 3: one of the two"
    assert _slot_rows_flag(dsn, schema, "queue:f")
    assert _units(dsn, schema) == {"queue:f": 2}
    assert client.complete(got[0])
    (last,) = client.claim("f", worker="w", limit=10)
    assert {got[0].job_id, last.job_id} == {a, b}
    assert client.complete(last)
    assert _units(dsn, schema) == {}


def test_a_batch_callback_carries_its_cost(client: leaseq.Client, dsn: str, schema: str) -> None:
    # Boundary: the callback path (its job is inserted by the database when the batch
    # fires, from the stored signature). Invariant: the callback job has the cost given.
    with client.batch(on_success=leaseq.Sig("report", None, {"queue": "cb", "cost": 2})) as b:
        b.enqueue("send", 1)
    (lease,) = client.claim(worker="w", limit=5)
    assert client.complete(lease)
    found = rows(dsn, "SELECT task, cost FROM {s}.jobs WHERE queue_name = 'cb'", schema)
    assert [(str(r[0]), int(r[1])) for r in found] == [("report", 2)]
    with pytest.raises(ConfigError, match="cost must be"):
        callback_spec(leaseq.Sig("report", None, {"cost": 0}))


def test_the_move_to_slot_rows_while_fast_claims_are_in_flight_never_overspends(
    client: leaseq.Client, dsn: str, schema: str
) -> None:
    # Boundary: a queue limit's slots move to slot rows while six claimers are taking
    # numbers on job rows by the fast path (the move waits for the claims in flight and
    # holds new ones back). Invariant: at every sampled instant the units held in both
    # places stay within the limit, and none is left at the end.
    client.set_limit("queue:q", concurrency=8)
    client.enqueue_many([{"task": "t", "queue": "q"} for _ in range(300)])
    peaks: list[int] = []
    errors: list[BaseException] = []
    stop = threading.Event()

    def claimer(n: int) -> None:
        c = leaseq.Client(dsn, schema=schema)
        try:
            while not stop.is_set():
                leases = c.claim("q", worker=f"w{n}", limit=2)
                if not leases:
                    time.sleep(0.005)
                for lease in leases:
                    c.complete(lease)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            c.close()

    def sampler() -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            while not stop.is_set():
                row = conn.execute(
                    f"SELECT count(*) FROM {schema}.held_slots WHERE limit_name = 'queue:q'"
                ).fetchone()
                assert row is not None
                peaks.append(int(row[0]))

    threads = [threading.Thread(target=claimer, args=(n,)) for n in range(6)]
    watch = threading.Thread(target=sampler)
    for t in [*threads, watch]:
        t.start()
    try:
        time.sleep(0.5)  # the fast path at work
        client.enqueue_many([{"task": "t", "queue": "q", "cost": 3} for _ in range(30)])
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            left = rows(dsn, "SELECT count(*) FROM {s}.jobs WHERE status <> 'succeeded'", schema)
            if left[0][0] == 0:
                break
            time.sleep(0.05)
    finally:
        stop.set()
        for t in [*threads, watch]:
            t.join()
    assert not errors
    assert _slot_rows_flag(dsn, schema, "queue:q"), "the costly jobs moved the limit"
    assert rows(dsn, "SELECT count(*) FROM {s}.jobs WHERE status <> 'succeeded'", schema)[0][0] == 0
    assert peaks and max(peaks) <= 8, max(peaks)
    assert _units(dsn, schema) == {}


def test_the_move_to_slot_rows_waits_for_a_claim_in_flight(
    client: leaseq.Client, dsn: str, schema: str
) -> None:
    # Boundary: a claim that wrote a queue slot on a job row has not committed when a job of
    # cost 3 makes the limit move to slot rows. Invariant: the move waits for that claim
    # (without the wait, the costly claim would not see the uncommitted number and take all
    # three units beside it: four of three); after it, the number on the job row counts.
    client.set_limit("queue:q", concurrency=3)
    small = int(client.enqueue("t", None, queue="q"))
    with psycopg.connect(dsn) as held:
        (lease,) = client.claim("q", worker="w1", limit=1, connection=held)
        assert lease.job_id == small
        big = int(client.enqueue("t", None, queue="q", cost=3))
        got: list[Any] = []
        other = leaseq.Client(dsn, schema=schema)
        claimer = threading.Thread(target=lambda: got.extend(other.claim("q", worker="w2")))
        claimer.start()
        claimer.join(1.0)
        assert claimer.is_alive(), "the move waits for the claim in flight"
        assert not _slot_rows_flag(dsn, schema, "queue:q")
        held.commit()
    claimer.join(30)
    other.close()
    assert not claimer.is_alive() and got == [], "1 unit held on a job row: 3 do not fit"
    assert _slot_rows_flag(dsn, schema, "queue:q")
    assert _units(dsn, schema) == {"queue:q": 1}
    assert client.complete(lease)
    (last,) = client.claim("q", worker="w2", limit=5)
    assert last.job_id == big
    assert _per_job(dsn, schema) == {("queue:q", big): 3}


def test_a_claim_in_a_callers_transaction_cannot_move_a_queue_limit_and_says_so(
    client: leaseq.Client, dsn: str, schema: str
) -> None:
    client.set_limit("queue:q", concurrency=3)
    client.enqueue("t", None, queue="q", cost=2)
    with psycopg.connect(dsn) as conn:
        with pytest.raises(ConfigError, match="under queue:q, whose slots must first move") as e:
            client.claim("q", worker="w", connection=conn)
        assert "\n" not in str(e.value)
    assert not _slot_rows_flag(dsn, schema, "queue:q")
    (lease,) = client.claim("q", worker="w")  # outside: the move, then the claim
    assert _per_job(dsn, schema) == {("queue:q", lease.job_id): 2}
