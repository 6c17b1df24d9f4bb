"""A schedule's ticks, by its own arithmetic: cron expressions in a time zone (cronsim:
a time skipped by a DST change fires once at the next existing time, a time that
occurs twice fires once), or every N milliseconds since the Unix epoch (so every
process agrees on the ticks without asking anyone). And what a scheduler fires when
it looks at a schedule that is due (:func:`plan`): the ticks that are only late, or
after downtime one tick (``latest``) or none; never a burst."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Literal
from zoneinfo import ZoneInfo

from cronsim import CronSim

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
#: A schedule whose next tick is this recent is late, not missed: its due ticks all
#: fire (a scheduler delayed by a slow machine or a quick Postgres restart must not
#: skip them). Older, and catch_up decides: one tick or none.
GRACE = timedelta(seconds=5)
#: Most late ticks one look fires (a schedule every 100 ms, 5 s late: 50).
MAX_LATE = 100
#: Most ticks walked to find the last due one of a cron schedule (a minutely
#: schedule down for 10 weeks); past that, the one reached stands in for it.
MAX_WALK = 100_000


@dataclass(frozen=True)
class Rule:
    """When a schedule ticks: ``cron`` in ``timezone``, or ``every_ms``."""

    cron: str | None
    every_ms: int | None
    timezone: str = "UTC"

    @property
    def zone(self) -> ZoneInfo:
        return ZoneInfo(self.timezone)

    def next_after(self, after: datetime) -> datetime:
        """The first tick strictly after ``after`` (in UTC)."""
        if self.every_ms is not None:
            step = timedelta(milliseconds=self.every_ms)
            n = (after - EPOCH) // step + 1
            return EPOCH + n * step
        assert self.cron is not None
        local = after.astimezone(self.zone)
        tick: datetime = next(iter(CronSim(self.cron, local)))
        return tick.astimezone(UTC)

    def last_at_or_before(self, first: datetime, cut: datetime) -> datetime:
        """The latest tick in [first, cut], ``first`` being a tick <= cut."""
        if self.every_ms is not None:
            step = timedelta(milliseconds=self.every_ms)
            return EPOCH + ((cut - EPOCH) // step) * step
        last = first
        for _ in range(MAX_WALK):
            following = self.next_after(last)
            if following > cut:
                return last
            last = following
        return last  # a cron expression ticking more than MAX_WALK times in the gap


def plan(
    rule: Rule,
    due_at: datetime,
    now: datetime,
    catch_up: Literal["none", "latest"],
    grace: timedelta = GRACE,
) -> tuple[list[datetime], datetime]:
    """The ticks to fire now for a schedule whose next tick was ``due_at`` (<= now),
    and the tick after them. If ``due_at`` is within ``grace`` of now the scheduler is
    only late: every due tick fires (at most MAX_LATE per look). Otherwise ticks were
    missed (the scheduler, or Postgres, was down): ``latest`` fires the most recent due
    tick once, ``none`` fires nothing, and the schedule moves on to its next tick."""
    if now - due_at <= grace:
        late: list[datetime] = []
        tick = due_at
        while tick <= now and len(late) < MAX_LATE:
            late.append(tick)
            tick = rule.next_after(tick)
        return late, tick
    fires = [rule.last_at_or_before(due_at, now)] if catch_up == "latest" else []
    return fires, rule.next_after(now)
