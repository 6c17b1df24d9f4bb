"""The scheduler: fires the due ticks of the schedules (cron) as the leader of its
advisory key, each tick's job inserted with the key ``schedule:<name>:<tick>`` in
the same transaction that moves the schedule's next tick on (DECISIONS 39)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from deadman import logs
from deadman.maintenance.service import MaintenanceService
from deadman.spec import ScheduleSpec, SpecError, validate
from deadman.store.maintenance import SCHEDULER_KEY, MaintenanceTx
from deadman.store.schedules import Schedule
from deadman.ticks import plan

log = logs.get("deadman.scheduler")

#: Most schedules one tick looks at; the rest are due at the next tick.
DUE_LIMIT = 100
#: When a schedule that no longer passes the spec is looked at again.
RETRY_INVALID = timedelta(hours=1)


def tick_key(name: str, tick: datetime) -> str:
    """The idempotency key of a tick's job: ``schedule:<name>:<tick RFC 3339, UTC>``."""
    stamp = tick.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    return f"schedule:{name}:{stamp}"


class Scheduler(MaintenanceService):
    """Ticks as often as the rescuer (DEADMAN_RESCUE_S); a schedule's tick is late by
    at most that (plus the commit) when the fleet is up."""

    name = "scheduler"
    key = SCHEDULER_KEY

    async def tick(self) -> int:
        fired = 0
        async with self.leadership.lead(self.key) as tx:
            if tx is None:
                return 0
            for schedule, now in await tx.schedule_due(DUE_LIMIT):
                fired += await self._fire(tx, schedule, now)
        return fired

    async def _fire(self, tx: MaintenanceTx, schedule: Schedule, now: datetime) -> int:
        try:
            spec = validate(ScheduleSpec, schedule.body())
        except SpecError as exc:
            # stored under rules that changed since (a tighter bound after an upgrade):
            # it fires nothing and is looked at again in an hour, logged each time
            log.error("schedule_invalid", schedule=schedule.name, error=str(exc)[:500])
            await tx.schedule_fired(schedule.name, now + RETRY_INVALID, None, None)
            return 0
        fires, following = plan(spec.rule, schedule.next_fire_at, now, spec.catch_up)
        job_id = None
        for tick in fires:
            new = spec.job.to_new_job(tick_key(schedule.name, tick))
            job_id = await tx.tick_job_insert(new, self._settings.max_attempts)
        await tx.schedule_fired(schedule.name, following, fires[-1] if fires else None, job_id)
        if fires:
            log.info("schedule_fired", schedule=schedule.name, ticks=len(fires), job=job_id)
        elif schedule.next_fire_at < now:
            log.info("schedule_skipped", schedule=schedule.name, catch_up=spec.catch_up)
        return len(fires)
