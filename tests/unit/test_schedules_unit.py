"""Schedules without a database: the tick identity a job carries, declarations checked at
``app.schedule``, changes merged and re-checked, and ``--no-schedules``."""

from __future__ import annotations

import datetime as dt

import pytest

from leaseq.app import App
from leaseq.cli import cli
from leaseq.cli.worker import config_from_options
from leaseq.errors import ConfigError
from leaseq.rules.schedule_timing import Timing
from leaseq.rules.schedules import ScheduleTick, changed, parse_tick_key, schedule_def, tick_key
from leaseq.worker import QueueSettings

WHEN = dt.datetime(2026, 10, 25, 0, 30, tzinfo=dt.UTC)


@pytest.mark.parametrize(("catch_up", "manual"), [(False, False), (True, False), (False, True)])
def test_tick_key_round_trips_including_names_with_slashes(catch_up: bool, manual: bool) -> None:
    key = tick_key("reports/daily:eu", WHEN, catch_up=catch_up, manual=manual)
    assert len(key) <= 200
    assert parse_tick_key(key) == ScheduleTick("reports/daily:eu", WHEN, catch_up, manual)


@pytest.mark.parametrize(
    "key",
    [None, "", "leaseq-job-5", "leaseq.schedule@nonsense/tick/x", "leaseq.schedule@"
     "2026-10-25T00:30:00.000000Z/weird/x", "leaseq.schedule@2026-10-25T00:30:00.000000Z/tick/"],
)  # fmt: skip
def test_other_idempotency_keys_are_no_tick(key: str | None) -> None:
    assert parse_tick_key(key) is None


def test_app_schedule_takes_task_defaults_and_refuses_duplicates() -> None:
    app = App()

    @app.task(name="r", queue="reports", priority=3, max_attempts=2)
    def r(ctx: object, payload: object) -> None:
        pass

    app.schedule("a", task=r, every=60)
    app.schedule("b", task="r", cron="0 3 * * *", queue="other", priority=-1)
    app.schedule("c", task="unregistered", every=5)
    defs = {d.name: d for d in app.schedule_defs()}
    assert (defs["a"].queue, defs["a"].priority, defs["a"].max_attempts) == ("reports", 3, 2)
    assert (defs["b"].queue, defs["b"].priority) == ("other", -1)
    assert defs["c"].queue == "default"
    with pytest.raises(ConfigError, match="declared twice"):
        app.schedule("a", task=r, every=60)
    with pytest.raises(ConfigError, match="catch_up"):
        app.schedule("d", task=r, every=60, catch_up="sometimes")
    with pytest.raises(ConfigError, match="catch_up_max"):
        app.schedule("d", task=r, every=60, catch_up="all", catch_up_max=0)
    with pytest.raises(ConfigError, match="schedule name"):
        app.schedule("bad name!", task=r, every=60)


def test_changes_merge_and_switch_between_cron_and_every() -> None:
    d = schedule_def("s", "t", every=60, payload={"a": 1})
    c = changed(d, {"cron": "*/5 * * * *", "tz": "Europe/Berlin", "payload": None})
    assert c.timing == Timing(cron="*/5 * * * *", tz="Europe/Berlin")
    assert c.payload == {"a": 1}
    back = changed(c, {"every": 30})
    assert back.timing == Timing(every=30, tz="Europe/Berlin")
    with pytest.raises(ConfigError):
        changed(d, {"overlap": "never"})


def test_no_schedules_flag_turns_the_ticker_off() -> None:
    ctx = cli.make_context("leaseq", ["worker", "tests.support.apps.basic:app", "--no-schedules"])
    worker_ctx = cli.commands["worker"].make_context(
        "worker", ["tests.support.apps.basic:app", "--no-schedules"], parent=ctx
    )
    config = config_from_options((QueueSettings("default"),), worker_ctx.params)
    assert config.schedules is False
    default = config_from_options(
        (QueueSettings("default"),),
        cli.commands["worker"].make_context("worker", ["x:app"], parent=ctx).params,
    )
    assert default.schedules is True
