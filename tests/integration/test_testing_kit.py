"""The testing kit (leaseq.testing) tested through its own pytest fixtures, on a real
PostgreSQL: a cloned database per test, assertions, perform_job, drain on the test's own
connection, and the test clock moving leaseq's time (backoff, lease expiry)."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

import leaseq
from leaseq.errors import PayloadError, Permanent, Retry
from leaseq.sql import latest_version
from leaseq.testing import Kit
from leaseq.testing.clock import Clock

app = leaseq.App()
seen: list[Any] = []


@app.task(name="kit.echo")
def echo(ctx: Any, payload: Any) -> Any:
    seen.append(payload)
    return {"echo": payload}


@app.task(name="kit.flaky", retry=leaseq.RetryPolicy(base=30, cap=30))
def flaky(ctx: Any, payload: Any) -> None:
    if ctx.attempt == 1:
        raise Retry("UPSTREAM_BUSY", "try later")


@app.task(name="kit.broken")
def broken(ctx: Any, payload: Any) -> None:
    raise Permanent("BAD_ACCOUNT", f"no account {payload['id']}")


@app.task(name="kit.fan_out")
def fan_out(ctx: Any, payload: Any) -> None:
    for n in range(payload["n"]):
        app.client.enqueue("kit.echo", {"n": n}, connection=payload_connection.get("conn"))


@app.task(name="kit.async_echo")
async def async_echo(ctx: Any, payload: Any) -> Any:
    return payload


payload_connection: dict[str, Any] = {}


@pytest.fixture(autouse=True)
def _reset() -> None:
    seen.clear()
    payload_connection.clear()


def test_each_test_gets_a_migrated_database_of_its_own(
    leaseq_client: leaseq.Client, leaseq_dsn: str, leaseq_server_dsn: str
) -> None:
    assert leaseq_client.schema_version() == latest_version()
    with psycopg.connect(leaseq_dsn) as conn:
        row = conn.execute("SELECT current_database()").fetchone()
    assert row is not None and row[0].startswith("leaseq_test_")
    leaseq_client.enqueue("kit.echo", {"a": 1})  # left behind on purpose: the next test
    # (below) must not see it


def test_a_previous_test_left_nothing_behind(leaseq_testing: Kit) -> None:
    assert leaseq_testing.enqueued_jobs() == []


def test_assert_enqueued_matches_payload_subset_queue_and_time(leaseq_testing: Kit) -> None:
    kit = leaseq_testing
    kit.client.enqueue("kit.echo", {"user": {"id": 7, "name": "ada"}, "x": [1]}, queue="mail")
    later = kit.client.enqueue("kit.echo", {"user": {"id": 8}}, delay=3600)

    job = kit.assert_enqueued(echo, payload_subset={"user": {"id": 7}}, queue="mail")
    assert job.payload["user"]["name"] == "ada"
    with pytest.raises(AssertionError, match=r"payload containing \{'user': \{'id': 9\}\}"):
        kit.assert_enqueued("kit.echo", payload_subset={"user": {"id": 9}})
    with pytest.raises(AssertionError, match="none of that task is pending"):
        kit.assert_enqueued("kit.flaky")
    # Scheduled an hour out: not runnable within a minute, but within two hours.
    with pytest.raises(AssertionError, match="runnable within 60s"):
        kit.assert_enqueued(echo, payload_subset={"user": {"id": 8}}, within=60)
    found = kit.assert_enqueued(echo, payload_subset={"user": {"id": 8}}, within=7200)
    assert found.job_id == later
    kit.refute_enqueued(echo, payload_subset={"user": {"id": 7}}, queue="default")
    with pytest.raises(AssertionError, match="expected no job"):
        kit.refute_enqueued(echo, payload_subset={"x": [1]})
    assert [j.payload["user"]["id"] for j in kit.enqueued_jobs(echo)] == [7, 8]


def test_perform_job_round_trips_the_payload_through_json(leaseq_testing: Kit) -> None:
    outcome = leaseq_testing.perform_job(echo, {"items": (1, 2)})
    assert outcome.succeeded and outcome.result == {"echo": {"items": [1, 2]}}
    assert seen == [{"items": [1, 2]}]  # the tuple came back a list, as a worker sees it
    job = leaseq_testing.client.get_job(outcome.job_id)
    assert job is not None and job.status == "succeeded"
    with pytest.raises(PayloadError):
        leaseq_testing.perform_job(echo, {"when": object()})


def test_perform_job_reports_retry_dead_and_async_handlers(leaseq_testing: Kit) -> None:
    retry = leaseq_testing.perform_job(flaky, {})
    assert (retry.status, retry.error_code, retry.error_class) == (
        "retry",
        "UPSTREAM_BUSY",
        "transient",
    )
    assert retry.retry_in is not None and 0 < retry.retry_in <= 30

    dead = leaseq_testing.perform_job(broken, {"id": 3})
    assert (dead.status, dead.error_code, dead.detail) == ("dead", "BAD_ACCOUNT", "no account 3")

    assert leaseq_testing.perform_job(async_echo, [1]).result == [1]


def test_advancing_the_clock_skips_a_retry_backoff(
    leaseq_testing: Kit, leaseq_clock: Clock
) -> None:
    kit = leaseq_testing
    kit.client.enqueue("kit.flaky", {})
    first = kit.drain(app)
    assert (first.succeeded, first.retried) == (0, 1)
    # The retry waits up to 30 s of back-off: nothing is runnable until the clock moves.
    assert kit.drain(app).outcomes == []
    leaseq_clock.advance(31)
    second = kit.drain(app)
    assert (second.succeeded, second.retried) == (1, 0)


def test_a_lease_expires_when_the_clock_passes_it_and_the_sweep_requeues(
    leaseq_client: leaseq.Client, leaseq_clock: Clock
) -> None:
    job_id = leaseq_client.enqueue("kit.echo", {})
    (lease,) = leaseq_client.claim(worker="w1", lease_seconds=60)
    assert leaseq_client.sweep().requeued == 0  # the lease is alive
    leaseq_clock.advance(61)
    assert leaseq_client.sweep().requeued == 1
    assert not leaseq_client.complete(lease)  # the fence refuses the expired lease
    job = leaseq_client.get_job(job_id)
    assert job is not None and job.status == "pending"


def test_a_frozen_clock_stands_still_until_advanced(leaseq_clock: Clock) -> None:
    leaseq_clock.freeze()
    first = leaseq_clock.now()
    assert leaseq_clock.now() == first
    leaseq_clock.advance(90)
    assert (leaseq_clock.now() - first).total_seconds() == 90
    leaseq_clock.unfreeze()
    assert leaseq_clock.now() >= first


def test_drain_runs_jobs_inside_the_callers_uncommitted_transaction(
    leaseq_testing: Kit, leaseq_dsn: str
) -> None:
    kit = leaseq_testing
    with psycopg.connect(leaseq_dsn) as conn:  # not autocommit: one open transaction
        payload_connection["conn"] = conn
        root = kit.client.enqueue("kit.fan_out", {"n": 2}, connection=conn)
        summary = kit.drain(app, connection=conn)
        # The fan-out's children were enqueued on the same connection and ran too.
        assert (summary.succeeded, summary.retried, summary.dead) == (3, 0, 0)
        assert seen == [{"n": 0}, {"n": 1}]
        job = kit.client.get_job(root, connection=conn)
        assert job is not None and job.status == "succeeded"
        # Nothing is visible outside the transaction...
        assert kit.client.get_job(root) is None
        conn.rollback()
    # ...and the rollback leaves no trace.
    assert kit.client.get_job(root) is None
    assert kit.client.count_jobs("succeeded") == 0


def test_drain_keeps_the_callers_transaction_usable_after_a_failing_handler(
    leaseq_testing: Kit, leaseq_dsn: str
) -> None:
    with psycopg.connect(leaseq_dsn) as conn:
        leaseq_testing.client.enqueue("kit.broken", {"id": 1}, connection=conn)
        summary = leaseq_testing.drain(app, connection=conn)
        assert (summary.dead, summary.outcomes[0].error_code) == (1, "BAD_ACCOUNT")
        assert leaseq_testing.client.count_jobs("dead") == 0  # uncommitted
        conn.commit()
    assert leaseq_testing.client.count_jobs("dead") == 1


def test_drain_include_scheduled_moves_the_clock_to_each_job(
    leaseq_testing: Kit, leaseq_clock: Clock
) -> None:
    leaseq_testing.client.enqueue("kit.echo", {"later": True}, delay=86400)
    assert leaseq_testing.drain(app).outcomes == []
    before = leaseq_clock.now()
    summary = leaseq_testing.drain(app, include_scheduled=True)
    assert summary.succeeded == 1 and seen == [{"later": True}]
    assert (leaseq_clock.now() - before).total_seconds() >= 86000


def test_claim_on_a_callers_connection_is_undone_by_its_rollback(
    leaseq_client: leaseq.Client, leaseq_dsn: str
) -> None:
    job_id = leaseq_client.enqueue("kit.echo", {})
    with psycopg.connect(leaseq_dsn) as conn:
        (lease,) = leaseq_client.claim(worker="w", connection=conn)
        assert lease.job_id == job_id
        conn.rollback()
    job = leaseq_client.get_job(job_id)
    assert job is not None and job.status == "pending" and job.attempt_count == 0


def test_drain_ends_a_job_of_an_unknown_task_dead_as_a_worker_would(leaseq_testing: Kit) -> None:
    leaseq_testing.client.enqueue("kit.nobody_handles_this", {})
    summary = leaseq_testing.drain(app)
    assert summary.dead == 1
    assert summary.outcomes[0].error_code == "UNKNOWN_TASK"
    assert summary.outcomes[0].error_class == "permanent"


def test_the_plugin_serves_a_project_without_leaseqs_own_conftest(
    pytester: pytest.Pytester, leaseq_server_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a user gets from installing leaseq: the fixtures come from the entry point."""
    monkeypatch.setenv("LEASEQ_TEST_DSN", leaseq_server_dsn)
    pytester.makepyfile(
        """
        import leaseq

        app = leaseq.App()

        @app.task(name="user.double")
        def double(ctx, payload):
            return payload["n"] * 2

        def test_user_suite(leaseq_testing):
            leaseq_testing.client.enqueue("user.double", {"n": 21})
            leaseq_testing.assert_enqueued("user.double", payload_subset={"n": 21})
            assert leaseq_testing.drain(app).outcomes[0].result == 42
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider", "-p", "no:asyncio")
    result.assert_outcomes(passed=1)


def test_an_applications_own_app_follows_every_tests_database_sync_and_async(
    pytester: pytest.Pytester, leaseq_server_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 30: the App caches its clients, so a second test used the first test's dropped
    database. With ``leaseq_use(app)`` (or ``app.dsn = leaseq_dsn``, as docs/testing.md
    shows) every test enqueues into its own database, sync and async, any number of tests."""
    monkeypatch.setenv("LEASEQ_TEST_DSN", leaseq_server_dsn)
    pytester.makepyfile(
        """
        import pytest
        import leaseq

        jobs = leaseq.App()

        @jobs.task(name="user.welcome")
        def welcome(ctx, payload):
            return payload["to"]

        @pytest.fixture(autouse=True)
        def _on_the_test_database(leaseq_use):
            leaseq_use(jobs)

        @pytest.mark.parametrize("n", range(3))
        def test_sync(n, leaseq_testing):
            welcome.enqueue({"to": f"s{n}"})
            assert [j.payload for j in leaseq_testing.enqueued_jobs()] == [{"to": f"s{n}"}]
            assert leaseq_testing.drain(jobs).succeeded == 1

        @pytest.mark.parametrize("n", range(3))
        async def test_async(n, leaseq_testing):
            await welcome.enqueue_async({"to": f"a{n}"})
            assert [j.payload for j in leaseq_testing.enqueued_jobs()] == [{"to": f"a{n}"}]

        @pytest.mark.parametrize("n", range(2))
        def test_setting_the_dsn_as_the_docs_show(n, leaseq_dsn, leaseq_testing):
            jobs.dsn = leaseq_dsn
            welcome.enqueue({"to": f"d{n}"})
            assert len(leaseq_testing.enqueued_jobs()) == 1
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider", "-o", "asyncio_mode=auto")
    result.assert_outcomes(passed=8)
    assert "PoolTimeout" not in result.stdout.str()
