"""The clients' flow-control and schedule calls, each written once (bound to both
clients by ``surface``), checked by ``deadman.spec`` exactly as ``PUT /limits/{key}``
and ``PUT /schedules/{name}`` check theirs: the same refusals, in the same words."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Generic, Literal, TypeVar

from deadman.clientcore.core import Call, Core
from deadman.clientcore.options import checked_name, to_ms
from deadman.connections import Joinable
from deadman.errors import NotFound
from deadman.spec import LimitSpec, ScheduleSpec, validate
from deadman.store import plans
from deadman.store.limits import Limit
from deadman.store.plan import Plan, Steps, then
from deadman.store.schedules import Schedule

T = TypeVar("T")


@dataclass(frozen=True)
class Named(Generic[T]):
    """A kind of thing addressed by a name, as the API's ``deadman.api.named``: its
    list, and get and delete by a name checked as the API checks its path's
    (``field``: what a refusal names)."""

    field: str
    listed: Callable[[], Plan[list[T]]]
    fetch: Callable[[str], Plan[T | None]]
    remove: Callable[[str], Plan[bool]]

    def all(self, client: Core, *, conn: Joinable | None = None) -> Call[list[T]]:
        return Call(self.listed(), conn)

    def get(self, client: Core, name: str, *, conn: Joinable | None = None) -> Call[T | None]:
        return Call(self.fetch(checked_name(name, self.field)), conn)

    def delete(self, client: Core, name: str, *, conn: Joinable | None = None) -> Call[bool]:
        return Call(self.remove(checked_name(name, self.field)), conn)


# -- limits (deadman.limits) -----------------------------------------------------------


def set_limit(
    client: Core,
    key: str,
    *,
    concurrency: int | None = None,
    rate: tuple[int, timedelta | float] | None = None,
    conn: Joinable | None = None,
) -> Call[Limit]:
    """Create or replace ``key``'s limit: at most ``concurrency`` of its jobs
    running at once across the fleet; at most ``rate[0]`` starts in any window of
    ``rate[1]`` (a timedelta, or seconds). It applies from the next claim. The rules
    are :class:`deadman.spec.LimitSpec`'s, as for ``PUT /limits/{key}``."""
    body: dict[str, Any] = {"concurrency": concurrency}
    if rate is not None:
        body["rate"] = {"count": rate[0], "per_ms": to_ms(rate[1])}
    spec = validate(LimitSpec, body)
    return Call(plans.limit_put(spec.params(checked_name(key, "key"))), conn)


#: limits by key: Client.limits(), .limit(key), .delete_limit(key)
LIMITS = Named("key", plans.limit_list, plans.limit_get, plans.limit_delete)


# -- schedules (deadman.schedules) -----------------------------------------------------


def set_schedule(
    client: Core,
    name: str,
    *,
    job: Mapping[str, Any],
    cron: str | None = None,
    every: timedelta | float | None = None,
    timezone: str | None = None,
    catch_up: Literal["none", "latest"] | None = None,
    conn: Joinable | None = None,
) -> Call[Schedule]:
    """Create or replace the schedule ``name``: enqueue ``job`` (the body of
    ``POST /jobs``: ``{"type": ..., "payload": ..., "queue": ...}``) at every tick of
    ``cron`` in ``timezone`` (default UTC), or ``every`` (a timedelta, or seconds);
    exactly one of the two. After downtime, ``catch_up="latest"`` (the default)
    enqueues the most recent missed tick once, ``"none"`` skips to the next. Checked
    by :class:`deadman.spec.ScheduleSpec` as ``PUT /schedules/{name}``; a replaced
    schedule keeps its paused flag, and its next tick is counted from now (the
    database's clock). ``created`` on the result says whether it is new."""
    name = checked_name(name, "name")
    given = {"cron": cron, "every_ms": to_ms(every), "timezone": timezone, "catch_up": catch_up}
    body = {"job": dict(job), **{k: v for k, v in given.items() if v is not None}}
    spec = validate(ScheduleSpec, body)

    def steps() -> Steps[Schedule]:
        now = yield from plans.db_now().steps()
        return (yield from plans.schedule_put(spec.params(name, now)).steps())

    return Call(Plan(steps), conn)


#: schedules by name: Client.schedules(), .schedule(name), .delete_schedule(name)
SCHEDULES = Named("name", plans.schedule_list, plans.schedule_get, plans.schedule_delete)


def pause_schedule(client: Core, name: str, *, conn: Joinable | None = None) -> Call[Schedule]:
    """Stop it firing until resumed; :class:`~deadman.errors.NotFound` if none."""
    return Call(_paused(name, True), conn)


def resume_schedule(client: Core, name: str, *, conn: Joinable | None = None) -> Call[Schedule]:
    """Fire it again from its next tick (the ticks it slept through count as missed:
    ``catch_up``); :class:`~deadman.errors.NotFound` if none."""
    return Call(_paused(name, False), conn)


def _paused(name: str, paused: bool) -> Plan[Schedule]:
    return then(plans.schedule_set_paused(checked_name(name, "name"), paused), _found(name))


def _found(name: str) -> Callable[[Schedule | None], Schedule]:
    def found(schedule: Schedule | None) -> Schedule:
        if schedule is None:
            raise NotFound(f"no schedule {name}")
        return schedule

    return found
