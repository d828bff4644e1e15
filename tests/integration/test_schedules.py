"""Periodic schedules on a real PostgreSQL: the unique tick row dedupes racing tickers
(including the repeated hour of a fall-back night), each catch-up policy after the tickers
were stopped (the stop is simulated by moving next_tick back in SQL, not by sleeping), the
overlap policies, code schedules synced at worker start, audited operator changes, and
runtime changes picked up by a running worker within one tick interval."""

from __future__ import annotations

import asyncio
import datetime as dt
import itertools
import threading
import time
from typing import Any

import pytest

import leaseq
from leaseq.errors import ConfigError
from leaseq.rules.schedule_timing import Timing
from leaseq.rules.schedules import parse_tick_key
from tests.support.helpers import rows, run_sql

UTC = dt.UTC


def jobs_of(dsn: str, schema: str, name: str) -> list[tuple[Any, ...]]:
    return rows(
        dsn,
        "SELECT j.id, t.tick_at, t.catch_up, j.status::text, j.ordering_key, j.blocked"
        " FROM {s}.schedule_ticks t JOIN {s}.jobs j ON j.id = t.job_id"
        " WHERE t.schedule_name = %s ORDER BY t.tick_at",
        schema,
        name,
    )


def stop_tickers_for(dsn: str, schema: str, name: str, ticks: int, every: int) -> None:
    """As if no ticker had run for the last ``ticks`` ticks: next_tick goes back that many
    intervals (onto the epoch-aligned grid of ``every``), and the schedule's history moves
    back with it, so the missed ticks are new ones."""
    shift = ticks * every
    run_sql(
        dsn,
        "UPDATE {s}.schedule_ticks SET tick_at = tick_at - make_interval(secs => %s)"
        " WHERE schedule_name = %s",
        schema,
        shift,
        name,
    )
    run_sql(
        dsn,
        "UPDATE {s}.schedules SET next_tick = to_timestamp("
        " (floor(extract(epoch FROM now()) / %s) + 1) * %s - %s),"
        " last_tick = last_tick - make_interval(secs => %s) WHERE name = %s",
        schema,
        every,
        every,
        shift,
        shift,
        name,
    )


# -- the unique tick row ---------------------------------------------------------------


async def test_two_tickers_racing_on_one_tick_make_one_job(
    dsn: str, schema: str, aclient: leaseq.AsyncClient
) -> None:
    await aclient.schedule_add("race", task="t", every=60)
    stop_tickers_for(dsn, schema, "race", 1, 60)
    other = leaseq.AsyncClient(dsn, schema=schema)
    try:
        results = await asyncio.gather(aclient.tick_schedules(), other.tick_schedules())
    finally:
        await other.close()
    assert sum(r.enqueued for r in results) == 1
    assert len(jobs_of(dsn, schema, "race")) == 1


async def test_same_tick_inserted_twice_bypassing_the_row_lock_makes_one_job(
    dsn: str, schema: str, aclient: leaseq.AsyncClient
) -> None:
    """The backstop: even two transactions that both computed the tick (no row lock held)
    cannot both enqueue it. The tick is 02:30 on the Berlin fall-back night, a local time
    that happens twice: both passes map to the same UTC instant, the first occurrence."""
    await aclient.schedule_add("ambiguous", task="t", cron="30 2 * * *", tz="Europe/Berlin")
    timing = Timing(cron="30 2 * * *", tz="Europe/Berlin")
    first = timing.next_after(dt.datetime(2026, 10, 24, 12, tzinfo=UTC))
    assert first == dt.datetime(2026, 10, 25, 0, 30, tzinfo=UTC)
    second_pass = dt.datetime(2026, 10, 25, 1, 30, tzinfo=UTC)  # 02:30 CET, the repeat
    assert timing.next_after(first) != second_pass

    made: list[int | None] = []
    barrier = asyncio.Barrier(2)

    async def insert(client: leaseq.AsyncClient) -> None:
        async with client.connection() as conn, conn.transaction():
            await barrier.wait()
            made.append(await client._tick_job(conn, "ambiguous", first, catch_up=False, key=None))

    other = leaseq.AsyncClient(dsn, schema=schema)
    try:
        await asyncio.gather(insert(aclient), insert(other))
    finally:
        await other.close()
    assert sorted(made, key=lambda x: x is None)[1] is None
    found = jobs_of(dsn, schema, "ambiguous")
    assert [(r[1]) for r in found] == [first]
    (key,) = rows(dsn, "SELECT idempotency_key FROM {s}.jobs", schema)[0]
    tick = parse_tick_key(key)
    assert tick is not None and tick.scheduled_for == first and not tick.catch_up


# -- catch-up --------------------------------------------------------------------------


def _missed_and_ticked(
    dsn: str, schema: str, client: leaseq.Client, ticks: int, **options: Any
) -> tuple[str, Any]:
    """A schedule every second whose tickers stopped for ``ticks`` ticks, then one tick
    call. The scenario holds only if that call runs within the second of the grid it was
    set up on (the database clock's): on a loaded machine a call that crosses into the
    next second rightly runs that second's tick too. Such a round is set up again."""
    for round_ in range(10):
        name = f"s{round_}"
        client.schedule_add(name, task="t", every=1, **options)
        ((before,),) = rows(dsn, "SELECT floor(extract(epoch FROM clock_timestamp()))", schema)
        stop_tickers_for(dsn, schema, name, ticks, 1)
        result = client.tick_schedules()
        ((after,),) = rows(dsn, "SELECT floor(extract(epoch FROM clock_timestamp()))", schema)
        if before == after:
            return name, result
        client.schedule_remove(name, actor="test", reason="the round crossed a second")
    pytest.fail("no round of set-up and tick ran within one second of the clock")


@pytest.mark.parametrize(
    ("policy", "expected"),
    [("none", [False]), ("latest", [False]), ("all", [True, True, True, True, False])],
)
def test_catch_up_after_tickers_stopped_for_five_ticks(
    dsn: str, schema: str, client: leaseq.Client, policy: str, expected: list[bool]
) -> None:
    name, result = _missed_and_ticked(dsn, schema, client, 5, catch_up=policy)
    found = jobs_of(dsn, schema, name)
    # the latest tick is at most a second old: on time; the others are catch-up runs
    assert [r[2] for r in found[-len(expected) :]] == expected
    assert len(found) == len(expected)
    assert result.enqueued == len(expected)
    assert result.skipped_catch_up >= 5 - len(expected)
    (skipped,) = rows(dsn, "SELECT skipped_ticks FROM {s}.schedules", schema)[0]
    assert skipped == result.skipped_catch_up
    ticks = [r[1] for r in found]
    assert all((b - a) == dt.timedelta(seconds=1) for a, b in itertools.pairwise(ticks))


def test_catch_up_all_is_bounded_by_catch_up_max(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    name, _ = _missed_and_ticked(dsn, schema, client, 50, catch_up="all", catch_up_max=3)
    assert len(jobs_of(dsn, schema, name)) == 3


def test_daily_tick_missed_hours_ago_latest_within_grace_runs_none_skips(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    ((age,),) = rows(
        dsn, "SELECT extract(epoch FROM now() - date_trunc('day', now()))::float8", schema
    )
    if age < 120:
        pytest.skip("too close to midnight UTC for a late daily tick")
    for name, policy in (("late-latest", "latest"), ("late-none", "none")):
        client.schedule_add(name, task="t", every=86400, catch_up=policy, grace=86400)
        stop_tickers_for(dsn, schema, name, 3, 86400)
    client.tick_schedules()
    latest = jobs_of(dsn, schema, "late-latest")
    assert len(latest) == 1 and latest[0][2] is True  # late: a catch-up run
    assert jobs_of(dsn, schema, "late-none") == []


# -- overlap ---------------------------------------------------------------------------


def test_overlap_skip_records_skipped_ticks_until_the_job_finishes(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    client.schedule_add("s", task="t", every=1, catch_up="all", overlap="skip")
    stop_tickers_for(dsn, schema, "s", 1, 1)
    client.tick_schedules()
    (first,) = jobs_of(dsn, schema, "s")
    # the job runs for three ticks: claimed, still running
    (lease,) = client.claim("default", worker="w", lease_seconds=60)
    stop_tickers_for(dsn, schema, "s", 3, 1)
    result = client.tick_schedules()
    assert result.enqueued == 0 and result.skipped_overlap == 3
    skipped = rows(
        dsn,
        "SELECT skipped FROM {s}.schedule_ticks WHERE job_id IS NULL ORDER BY tick_at",
        schema,
    )
    assert skipped == [("overlap",)] * 3
    client.complete(lease)
    stop_tickers_for(dsn, schema, "s", 1, 1)
    client.tick_schedules()
    assert len(jobs_of(dsn, schema, "s")) == 2
    assert first[0] in [r[0] for r in jobs_of(dsn, schema, "s")]


def test_overlap_queue_orders_tick_jobs_behind_each_other(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    client.schedule_add("s", task="t", every=1, catch_up="all", overlap="queue")
    stop_tickers_for(dsn, schema, "s", 3, 1)
    client.tick_schedules()
    found = jobs_of(dsn, schema, "s")
    assert [r[4] for r in found] == ["leaseq.schedule:s"] * 3
    assert [r[5] for r in found] == [False, True, True]  # only the first may run
    leases = client.claim("default", worker="w", lease_seconds=60, limit=10)
    assert [lease.job_id for lease in leases] == [found[0][0]]


# -- code schedules and operator changes -------------------------------------------------


def test_code_schedules_upsert_and_undeclared_ones_are_disabled(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    app = leaseq.App(dsn, schema=schema)

    @app.task(name="report", queue="reports", priority=5)
    def report(ctx: leaseq.JobContext, payload: Any) -> None:
        pass

    app.schedule("nightly", task=report, cron="0 3 * * *", tz="Europe/Berlin")
    app.schedule("often", task="report", every=30, payload={"x": 1})
    assert client.sync_code_schedules(app.schedule_defs(), app.tasks, actor="w1") == ([], [])
    stored = {s.name: s for s in client.schedules()}
    assert stored["nightly"].definition.queue == "reports"
    assert stored["nightly"].definition.priority == 5
    assert stored["often"].definition.payload == {"x": 1}
    assert stored["often"].source == "code"
    next_tick = stored["nightly"].next_tick
    # a second start changes nothing; an operator's disable outlasts restarts
    assert client.schedule_disable("nightly", reason="maintenance", actor="ops")
    client.sync_code_schedules(app.schedule_defs(), app.tasks, actor="w2")
    again = client.schedules("nightly")[0]
    assert not again.enabled and again.next_tick == next_tick
    # "often" no longer declared: disabled, history kept
    del app.schedules["often"]
    _, disabled = client.sync_code_schedules(app.schedule_defs(), app.tasks, actor="w3")
    assert disabled == ["often"]
    assert not client.schedules("often")[0].enabled
    # code schedules are changed in code, not here
    with pytest.raises(ConfigError, match="declared in code"):
        client.schedule_change("often", every=5)
    with pytest.raises(ConfigError, match="declared in code"):
        client.schedule_remove("often")
    actions = [(e.value, e.action, e.actor) for e in client.admin_events(scope="schedule")]
    assert ("often", "schedule.disable", "w3") in actions
    assert ("nightly", "schedule.disable", "ops") in actions


def test_bad_declarations_are_one_line_errors_and_store_nothing(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    app = leaseq.App(dsn, schema=schema)
    for kwargs in (
        {"cron": "99 * * * *"},
        {"cron": "* * * * *", "tz": "Nowhere/Land"},
        {"cron": "* * * * *", "every": 5},
        {},
        {"every": 0.2},
        {"every": 5, "overlap": "sometimes"},
    ):
        with pytest.raises(ConfigError) as caught:
            app.schedule("x", task="t", **kwargs)
        assert "\n" not in str(caught.value)
        with pytest.raises(ConfigError):
            client.schedule_add("x", task="t", **kwargs)
    assert app.schedules == {}
    assert client.schedules() == []


def test_dynamic_schedule_add_change_run_remove_are_audited(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    added = client.schedule_add("dyn", task="t", every=3600, actor="ann", reason="new report")
    assert added.source == "dynamic" and added.next_tick > added.read_at
    with pytest.raises(ConfigError, match="already exists"):
        client.schedule_add("dyn", task="t", every=60)
    changed = client.schedule_change("dyn", cron="*/5 * * * *", actor="bob", reason="faster")
    assert changed.definition.timing == Timing(cron="*/5 * * * *")
    job_id = client.schedule_run_now("dyn", actor="cy", reason="now please")
    job = client.get_job(job_id)
    assert job is not None and job.task == "t"
    assert parse_tick_key(job.idempotency_key) is not None
    assert client.schedules("dyn")[0].last_job_id == job_id
    assert client.schedule_remove("dyn", actor="dee", reason="done")
    assert client.schedules() == []
    assert client.get_job(job_id) is not None  # its jobs stay
    trail = [
        (e.action, e.actor, e.reason)
        for e in reversed(client.admin_events(scope="schedule", value="dyn"))
    ]
    assert trail == [
        ("schedule.add", "ann", "new report"),
        ("schedule.change", "bob", "faster"),
        ("schedule.run", "cy", "now please"),
        ("schedule.remove", "dee", "done"),
    ]


# -- a running worker ------------------------------------------------------------------


def test_running_worker_picks_up_added_changed_and_disabled_schedules(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    """Within one tick interval (the ticker sleeps at most 1 s): an added schedule starts
    ticking, a changed one follows its new timing, a disabled one creates nothing more."""
    app = leaseq.App(dsn, schema=schema)
    seen: list[leaseq.ScheduleTick | None] = []

    @app.task(name="t")
    def t(ctx: leaseq.JobContext, payload: Any) -> None:
        seen.append(ctx.schedule)

    worker = leaseq.Worker(app, leaseq.WorkerConfig(poll_interval=0.05))
    thread = threading.Thread(target=lambda: asyncio.run(worker.run()))
    thread.start()
    try:

        def count() -> int:
            return len(rows(dsn, "SELECT 1 FROM {s}.schedule_ticks", schema))

        def wait_for(predicate: Any, timeout: float = 10.0) -> None:
            deadline = time.monotonic() + timeout
            while not predicate():
                assert time.monotonic() < deadline, "not picked up in time"
                time.sleep(0.05)

        client.schedule_add("live", task="t", every=1, payload={"n": 1})
        wait_for(lambda: count() >= 2)
        client.schedule_change("live", every=3600)
        ((next_tick,),) = rows(dsn, "SELECT next_tick FROM {s}.schedules", schema)
        assert next_tick.timestamp() % 3600 == 0
        client.schedule_change("live", every=1)
        wait_for(lambda: count() >= 4)
        client.schedule_disable("live", reason="stop")
        ((disabled_at,),) = rows(dsn, "SELECT max(at) FROM {s}.admin_events", schema)
        time.sleep(1.5)
        late = rows(
            dsn, "SELECT 1 FROM {s}.schedule_ticks WHERE created_at > %s", schema, disabled_at
        )
        assert late == []
        wait_for(lambda: len(seen) >= 4)
    finally:
        worker.stop()
        thread.join(30)
    ticks = [s for s in seen if s is not None]
    assert ticks and all(s.name == "live" and not s.catch_up for s in ticks)
    assert worker.stats.ticks_enqueued == count()
    exposed = worker.metrics.registry.get_sample_value(
        "leaseq_schedule_ticks_total", {"outcome": "enqueued"}
    )
    assert exposed == worker.stats.ticks_enqueued


def test_metrics_show_schedule_lag(dsn: str, schema: str, client: leaseq.Client) -> None:
    client.schedule_add("s", task="t", every=60)
    assert client.database_health()["schedule_lag"] == 0.0
    stop_tickers_for(dsn, schema, "s", 3, 60)
    assert client.database_health()["schedule_lag"] >= 120.0


@pytest.mark.slow
def test_overlap_skip_with_a_job_that_runs_for_three_ticks(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    """A code schedule (stored by the worker at start) ticking every second whose job takes
    three: never two at once, and the ticks in between are recorded as skipped."""
    app = leaseq.App(dsn, schema=schema)
    lock = threading.Lock()
    active = 0
    peak = 0
    runs: list[dt.datetime] = []

    @app.task(name="long")
    def long(ctx: leaseq.JobContext, payload: Any) -> None:
        nonlocal active, peak
        with lock:
            active += 1
            peak = max(peak, active)
        assert ctx.schedule is not None
        time.sleep(3.0)
        with lock:
            active -= 1
            runs.append(ctx.schedule.scheduled_for)

    app.schedule("long", task=long, every=1, overlap="skip", catch_up="none")
    worker = leaseq.Worker(app, leaseq.WorkerConfig(poll_interval=0.05, concurrency=4))
    thread = threading.Thread(target=lambda: asyncio.run(worker.run()))
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while len(runs) < 2:
            assert time.monotonic() < deadline, "two runs did not finish in time"
            time.sleep(0.1)
    finally:
        worker.stop()
        thread.join(30)
    assert peak == 1
    skipped = rows(
        dsn,
        "SELECT tick_at FROM {s}.schedule_ticks WHERE skipped = 'overlap' AND tick_at > %s"
        " AND tick_at < %s",
        schema,
        runs[0],
        runs[1],
    )
    assert len(skipped) >= 2  # the ticks while the first job ran
    assert client.schedules("long")[0].source == "code"


def test_schedule_whose_ticks_cannot_be_computed_is_parked_not_stalling_the_others(
    dsn: str, schema: str, client: leaseq.Client
) -> None:
    """A stored timing this code cannot read (written by hand, or by another version) would
    stay the earliest due schedule for ever: it is disabled and audited instead."""
    client.schedule_add("broken", task="t", every=60)
    client.schedule_add("fine", task="t", every=1)
    run_sql(
        dsn,
        "UPDATE {s}.schedules SET cron = '0 0 31 2 *', every_seconds = NULL,"
        " next_tick = now() - interval '1 hour' WHERE name = 'broken'",
        schema,
    )
    stop_tickers_for(dsn, schema, "fine", 1, 1)
    result = client.tick_schedules()
    assert result.parked == 1 and result.enqueued == 1
    assert not client.schedules("broken")[0].enabled
    assert len(jobs_of(dsn, schema, "fine")) == 1
    (event,) = client.admin_events(scope="schedule", value="broken", limit=1)
    assert event.action == "schedule.disable" and "cannot compute" in (event.reason or "")
