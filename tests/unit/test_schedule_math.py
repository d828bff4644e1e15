"""Tick arithmetic with frozen instants: DST in both directions (Europe/Berlin,
America/New_York), fixed intervals, and each catch-up policy. No clock, no sleeps."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from leaseq.errors import ConfigError
from leaseq.rules.schedule_timing import ON_TIME, Timing, due


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


def ticks(timing: Timing, start: datetime, n: int) -> list[datetime]:
    found = []
    for _ in range(n):
        start = timing.next_after(start)
        found.append(start)
    return found


# -- spring forward: a local time that does not exist runs once, right after the gap ----


def test_berlin_spring_forward_missing_time_runs_at_first_instant_after_gap() -> None:
    # 2026-03-29: 02:00 CET -> 03:00 CEST (01:00 UTC); 02:30 does not exist.
    t = Timing(cron="30 2 * * *", tz="Europe/Berlin")
    assert ticks(t, utc(2026, 3, 28, 12), 3) == [
        utc(2026, 3, 29, 1, 0),  # 03:00 CEST, the first instant after the gap
        utc(2026, 3, 30, 0, 30),  # 02:30 CEST
        utc(2026, 3, 31, 0, 30),
    ]


def test_berlin_spring_forward_times_inside_gap_collapse_into_one_tick() -> None:
    t = Timing(cron="*/15 2,3 * * *", tz="Europe/Berlin")
    # 02:00, 02:15, 02:30, 02:45 and 03:00 are all 01:00 UTC: one tick, then 03:15 CEST.
    assert ticks(t, utc(2026, 3, 29, 0, 50), 3) == [
        utc(2026, 3, 29, 1, 0),
        utc(2026, 3, 29, 1, 15),
        utc(2026, 3, 29, 1, 30),
    ]


def test_new_york_spring_forward_missing_time_runs_at_first_instant_after_gap() -> None:
    # 2026-03-08: 02:00 EST -> 03:00 EDT (07:00 UTC).
    t = Timing(cron="30 2 * * *", tz="America/New_York")
    assert ticks(t, utc(2026, 3, 7, 12), 2) == [utc(2026, 3, 8, 7, 0), utc(2026, 3, 9, 6, 30)]


# -- fall back: an ambiguous local time runs once, at its first occurrence -----------------


def test_berlin_fall_back_ambiguous_time_runs_once_at_first_occurrence() -> None:
    # 2026-10-25: 03:00 CEST -> 02:00 CET (01:00 UTC); 02:30 happens twice.
    t = Timing(cron="30 2 * * *", tz="Europe/Berlin")
    assert ticks(t, utc(2026, 10, 24, 12), 2) == [
        utc(2026, 10, 25, 0, 30),  # 02:30 CEST, the first pass
        utc(2026, 10, 26, 1, 30),  # the next day's 02:30 CET; no tick at 01:30 UTC
    ]


def test_new_york_fall_back_ambiguous_time_runs_once_at_first_occurrence() -> None:
    # 2026-11-01: 02:00 EDT -> 01:00 EST (06:00 UTC); 01:30 happens twice.
    t = Timing(cron="30 1 * * *", tz="America/New_York")
    assert ticks(t, utc(2026, 10, 31, 12), 2) == [utc(2026, 11, 1, 5, 30), utc(2026, 11, 2, 6, 30)]


def test_hourly_cron_has_no_ticks_in_the_repeated_hour() -> None:
    t = Timing(cron="0 * * * *", tz="Europe/Berlin")
    assert ticks(t, utc(2026, 10, 24, 23, 30), 3) == [
        utc(2026, 10, 25, 0, 0),  # 02:00 CEST
        utc(2026, 10, 25, 2, 0),  # 03:00 CET: 02:00 CET (01:00 UTC) repeats a local time
        utc(2026, 10, 25, 3, 0),
    ]


def test_next_tick_from_inside_the_second_pass_is_after_it() -> None:
    # 01:20 UTC is 02:20 CET, the second pass: 02:30 CEST already happened an hour ago.
    t = Timing(cron="*/15 * * * *", tz="Europe/Berlin")
    assert t.next_after(utc(2026, 10, 25, 1, 20)) == utc(2026, 10, 25, 2, 0)


def test_utc_cron_and_seconds_field() -> None:
    assert ticks(Timing(cron="*/2 * * * * *"), utc(2026, 1, 1, 0, 0, 0), 3) == [
        utc(2026, 1, 1, 0, 0, 2),
        utc(2026, 1, 1, 0, 0, 4),
        utc(2026, 1, 1, 0, 0, 6),
    ]


def test_every_is_aligned_to_the_epoch_and_ignores_zones() -> None:
    t = Timing(every=90, tz="Europe/Berlin")
    assert t.next_after(utc(2026, 1, 1, 0, 0, 1)) == utc(2026, 1, 1, 0, 1, 30)
    assert t.next_after(utc(2026, 1, 1, 0, 1, 30)) == utc(2026, 1, 1, 0, 3, 0)
    # a DST change does not bend an interval
    h = Timing(every=3600, tz="Europe/Berlin")
    assert ticks(h, utc(2026, 10, 25, 0, 0), 2) == [utc(2026, 10, 25, 1), utc(2026, 10, 25, 2)]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"cron": "61 * * * *"}, "bad cron"),
        ({"cron": "* * *"}, "5 fields"),
        ({"cron": "* * * * *", "every": 5}, "exactly one"),
        ({}, "exactly one"),
        ({"every": 0.5}, "at least 1|between 1 second"),
        ({"every": "5"}, "number of seconds"),
        ({"cron": "* * * * *", "tz": "Mars/Olympus"}, "unknown time zone"),
    ],
)
def test_bad_timing_is_one_line(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message) as caught:
        Timing(**kwargs)  # type: ignore[arg-type]
    assert "\n" not in str(caught.value)


def test_every_accepts_a_timedelta() -> None:
    assert Timing(every=timedelta(minutes=5)).every == 300.0


# -- catch-up ------------------------------------------------------------------------------

EVERY_MIN = Timing(every=60)
NOW = utc(2026, 5, 1, 12, 0, 30)


def test_on_time_tick_is_not_a_catch_up() -> None:
    d = due(EVERY_MIN, next_tick=utc(2026, 5, 1, 12, 0), now=NOW)
    assert d.ticks == ((utc(2026, 5, 1, 12, 0), False),)
    assert d.skipped == 0
    assert d.next_tick == utc(2026, 5, 1, 12, 1)


def test_nothing_due_before_next_tick() -> None:
    d = due(EVERY_MIN, next_tick=utc(2026, 5, 1, 12, 1), now=NOW)
    assert d.ticks == () and d.next_tick == utc(2026, 5, 1, 12, 1)


def test_catch_up_latest_runs_most_recent_missed_tick_once() -> None:
    # tickers stopped for 5 ticks; the latest tick is 30 s old
    d = due(EVERY_MIN, next_tick=utc(2026, 5, 1, 11, 55), now=NOW, catch_up="latest")
    assert d.ticks == ((utc(2026, 5, 1, 12, 0), False),)
    assert d.skipped == 5


def test_catch_up_latest_outside_grace_runs_nothing() -> None:
    t = Timing(cron="0 3 * * *")
    now = utc(2026, 5, 1, 3, 20)
    d = due(t, next_tick=utc(2026, 5, 1, 3, 0), now=now, catch_up="latest", grace=600)
    assert d.ticks == () and d.skipped == 1
    d = due(t, next_tick=utc(2026, 5, 1, 3, 0), now=now, catch_up="latest", grace=1800)
    assert d.ticks == ((utc(2026, 5, 1, 3, 0), True),)  # late beyond ON_TIME: a catch-up


def test_catch_up_none_skips_every_missed_tick() -> None:
    t = Timing(cron="0 3 * * *")
    late = utc(2026, 5, 1, 3, 0) + timedelta(seconds=ON_TIME + 1)
    d = due(t, next_tick=utc(2026, 4, 29, 3, 0), now=late, catch_up="none")
    assert d.ticks == () and d.skipped == 3
    assert d.next_tick == utc(2026, 5, 2, 3, 0)
    d = due(EVERY_MIN, next_tick=utc(2026, 5, 1, 11, 0), now=NOW, catch_up="none")
    assert d.ticks == ((utc(2026, 5, 1, 12, 0), False),) and d.skipped == 60


def test_catch_up_all_runs_every_missed_tick_bounded() -> None:
    d = due(EVERY_MIN, next_tick=utc(2026, 5, 1, 11, 57), now=NOW, catch_up="all")
    assert d.ticks == (
        (utc(2026, 5, 1, 11, 57), True),
        (utc(2026, 5, 1, 11, 58), True),
        (utc(2026, 5, 1, 11, 59), True),
        (utc(2026, 5, 1, 12, 0), False),
    )
    d = due(EVERY_MIN, next_tick=utc(2026, 5, 1, 10, 0), now=NOW, catch_up="all", catch_up_max=3)
    assert [t for t, _ in d.ticks] == [
        utc(2026, 5, 1, 11, 58),
        utc(2026, 5, 1, 11, 59),
        utc(2026, 5, 1, 12, 0),
    ]
    assert d.skipped == 118


def test_catch_up_all_over_a_dst_gap_has_one_tick_per_instant() -> None:
    t = Timing(cron="*/30 * * * *", tz="Europe/Berlin")
    d = due(t, next_tick=utc(2026, 3, 29, 0, 30), now=utc(2026, 3, 29, 1, 40), catch_up="all")
    assert [x for x, _ in d.ticks] == [
        utc(2026, 3, 29, 0, 30),  # 01:30 CET
        utc(2026, 3, 29, 1, 0),  # 02:00, 02:30 (missing) and 03:00 CEST: one instant
        utc(2026, 3, 29, 1, 30),
    ]
