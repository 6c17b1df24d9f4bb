"""Schedules (``deadman.schedules``) as the store reads and writes them: the
``Schedule`` record, the API's statements (async, ``ScheduleStore``), and the
scheduler's, which run in the leader's transaction (``Firing``, mixed into
MaintenanceTx)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any, Literal, LiteralString

from psycopg.rows import DictRow
from psycopg.types.json import Jsonb

from deadman.bounds import SCHEDULES_LISTED_MAX
from deadman.model import Job
from deadman.store.async_base import AsyncBase
from deadman.store.jobs import NewJob

#: A schedule's definition: the fields PUT /schedules/{name} sets (ScheduleSpec), which
#: the scheduler reads back (Schedule.body) and the API shows.
DEFINITION = ("cron", "every_ms", "timezone", "job", "catch_up")


@dataclass(frozen=True)
class Schedule:
    name: str
    cron: str | None
    every_ms: int | None
    timezone: str
    job: dict[str, Any]
    catch_up: Literal["none", "latest"]
    paused: bool
    next_fire_at: datetime
    last_fire_at: datetime | None
    last_job_id: int | None
    #: made by this PUT (201), not replaced (200)
    created: bool = False

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Schedule:
        return cls(
            name=row["name"],
            cron=row["cron"],
            every_ms=None if row["every_ms"] is None else int(row["every_ms"]),
            timezone=row["timezone"],
            job=row["job"],
            catch_up=row["catch_up"],
            paused=bool(row["paused"]),
            next_fire_at=row["next_fire_at"],
            last_fire_at=row["last_fire_at"],
            last_job_id=None if row["last_job_id"] is None else int(row["last_job_id"]),
            created=bool(row["created"]),
        )

    def body(self) -> dict[str, Any]:
        """The definition as ScheduleSpec reads it (the scheduler re-checks it)."""
        return {field: getattr(self, field) for field in DEFINITION}


@dataclass(frozen=True)
class ScheduleParams:
    """What schedule_put and schedule_declare store (ScheduleSpec.params builds it)."""

    name: str
    cron: str | None
    every_ms: int | None
    timezone: str
    job: dict[str, Any]
    catch_up: str
    next_fire_at: datetime


def schedule_params(p: ScheduleParams) -> dict[str, Any]:
    return {**asdict(p), "job": Jsonb(p.job)}


def schedules_of(rows: list[Any]) -> list[Schedule]:
    return [Schedule.from_row(r) for r in rows]


def _first(rows: list[Any]) -> Schedule | None:
    return Schedule.from_row(rows[0]) if rows else None


class ScheduleStore(AsyncBase):
    """The schedule statements of the API and of a worker declaring its schedules."""

    async def db_now(self) -> datetime:
        rows = await self._all("db_now", {})
        now: datetime = rows[0]["now"]
        return now

    async def schedule_put(self, p: ScheduleParams) -> Schedule:
        return schedules_of(await self._all("schedule_put", schedule_params(p)))[0]

    async def schedule_declare(self, p: ScheduleParams) -> Schedule:
        return schedules_of(await self._all("schedule_declare", schedule_params(p)))[0]

    async def schedule_list(self) -> list[Schedule]:
        return schedules_of(await self._all("schedule_list", {"cap": SCHEDULES_LISTED_MAX}))

    async def schedule_get(self, name: str) -> Schedule | None:
        return _first(await self._all("schedule_get", {"name": name}))

    async def schedule_delete(self, name: str) -> bool:
        return bool(await self._all("schedule_delete", {"name": name}))

    async def schedule_set_paused(self, name: str, paused: bool) -> Schedule | None:
        return _first(await self._all("schedule_set_paused", {"name": name, "paused": paused}))


class Firing:
    """The scheduler's statements, in the leader's transaction (MaintenanceTx)."""

    async def _all(self, name: LiteralString, params: dict[str, Any]) -> list[DictRow]:
        raise NotImplementedError  # pragma: no cover - MaintenanceTx provides it

    async def schedule_due(self, limit: int) -> list[tuple[Schedule, datetime]]:
        rows = await self._all("schedule_due", {"limit": limit})
        return [(Schedule.from_row(r), r["db_now"]) for r in rows]

    async def tick_job_insert(self, job: NewJob, default_max_attempts: int) -> int:
        """The tick's job, or the one its key already made: its id."""
        rows = await self._all("job_insert", job.params(default_max_attempts))
        if not rows:
            assert job.idempotency_key is not None
            rows = await self._all(
                "job_get_by_idempotency_key", {"idempotency_key": job.idempotency_key}
            )
        return Job.from_row(rows[0]).id

    async def schedule_fired(
        self,
        name: str,
        next_fire_at: datetime,
        last_fire_at: datetime | None,
        last_job_id: int | None,
    ) -> None:
        await self._all(
            "schedule_fired",
            {
                "name": name,
                "next_fire_at": next_fire_at,
                "last_fire_at": last_fire_at,
                "last_job_id": last_job_id,
            },
        )
