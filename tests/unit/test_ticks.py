"""A schedule's ticks by its own arithmetic, and what a look at a due schedule fires.
Expected instants are written out by hand (UTC), never computed by the code under
test; the DST days are Europe/Berlin's in 2026 (29 March, 25 October)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Literal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from deadman.ticks import GRACE, MAX_LATE, Rule, plan

T0 = datetime(2026, 1, 1, tzinfo=UTC)
SECOND = timedelta(seconds=1)


def test_every_ms_ticks_on_multiples_since_the_epoch() -> None:
    r = Rule(None, 1000)
    assert r.next_after(T0) == T0 + SECOND
    assert r.next_after(T0 + timedelta(milliseconds=1)) == T0 + SECOND
    assert r.next_after(T0 - timedelta(milliseconds=1)) == T0
    assert Rule(None, 60_000).next_after(T0 + 30 * SECOND) == T0 + 60 * SECOND


def test_cron_ticks_in_its_time_zone() -> None:
    # 09:00 in Berlin is 08:00 UTC in winter
    r = Rule("0 9 * * *", None, "Europe/Berlin")
    assert r.next_after(T0) == datetime(2026, 1, 1, 8, tzinfo=UTC)
    assert Rule("*/5 * * * *", None).next_after(T0) == T0 + 5 * 60 * SECOND


@pytest.mark.parametrize(
    ("after", "expected"),
    [
        # spring forward: 02:00 does not exist on 29 March; fires once, at 03:00 CEST
        (datetime(2026, 3, 28, 12, tzinfo=UTC), datetime(2026, 3, 29, 1, tzinfo=UTC)),
        # the next day, back to 02:00 CEST
        (datetime(2026, 3, 29, 12, tzinfo=UTC), datetime(2026, 3, 30, 0, tzinfo=UTC)),
        # fall back: 02:00 happens twice on 25 October; fires once, at the first (CEST)
        (datetime(2026, 10, 24, 12, tzinfo=UTC), datetime(2026, 10, 25, 0, tzinfo=UTC)),
        (datetime(2026, 10, 25, 0, tzinfo=UTC), datetime(2026, 10, 26, 1, tzinfo=UTC)),
    ],
)
def test_a_2am_schedule_fires_once_on_both_dst_days(after: datetime, expected: datetime) -> None:
    assert Rule("0 2 * * *", None, "Europe/Berlin").next_after(after) == expected


def test_two_dst_days_fire_exactly_once_each() -> None:
    r = Rule("0 2 * * *", None, "Europe/Berlin")
    for start in (datetime(2026, 3, 28, tzinfo=UTC), datetime(2026, 10, 24, tzinfo=UTC)):
        ticks, t = [], start
        while t < start + timedelta(days=3):
            t = r.next_after(t)
            ticks.append(t)
        days = [x.astimezone(r.zone).date() for x in ticks[:3]]
        assert len(set(days)) == 3, ticks  # one tick per local day, none doubled


def test_late_ticks_all_fire() -> None:
    fires, after = plan(Rule(None, 1000), T0, T0 + timedelta(milliseconds=2500), "none")
    assert fires == [T0, T0 + SECOND, T0 + 2 * SECOND]
    assert after == T0 + 3 * SECOND


@pytest.mark.parametrize(("catch_up", "fired"), [("latest", [T0 + 60 * SECOND]), ("none", [])])
def test_after_downtime_one_tick_or_none(
    catch_up: Literal["none", "latest"], fired: list[datetime]
) -> None:
    fires, after = plan(
        Rule(None, 1000), T0, T0 + timedelta(seconds=60, milliseconds=300), catch_up
    )
    assert fires == fired
    assert after == T0 + 61 * SECOND


def test_a_cron_schedule_down_for_hours_fires_its_last_tick() -> None:
    r = Rule("*/5 * * * *", None)
    fires, after = plan(r, T0 + 300 * SECOND, T0 + timedelta(hours=3, seconds=7), "latest")
    assert fires == [T0 + timedelta(hours=3)]
    assert after == T0 + timedelta(hours=3, minutes=5)


@settings(max_examples=200, deadline=None, database=None)
@given(
    every=st.integers(100, 3_600_000),
    offset_ms=st.integers(0, 10_000_000),
    catch_up=st.sampled_from(["none", "latest"]),
)
def test_a_look_never_bursts_and_always_moves_on(every: int, offset_ms: int, catch_up: str) -> None:
    r = Rule(None, every)
    due = r.next_after(T0)
    now = due + timedelta(milliseconds=offset_ms)
    fires, after = plan(r, due, now, catch_up)  # type: ignore[arg-type]
    assert after > (fires[-1] if fires else due - SECOND)
    assert fires == sorted(set(fires)) and all(due <= f <= now for f in fires)
    if now - due > GRACE:
        assert len(fires) <= 1 and after > now  # downtime: one tick at most
    else:
        assert len(fires) <= MAX_LATE
