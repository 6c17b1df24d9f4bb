"""The vacuumer: VACUUM of deadman.jobs once enough dead versions pile up, without
waiting for autovacuum (DECISIONS 72).

Every finished job leaves its 'queued' entry in the claim index until a vacuum
removes it, and those entries sort before every job queued since, so each claim
reads their leaf pages. Autovacuum looks at a database once per
``autovacuum_naptime`` (60 s by default, a server setting) and then works throttled:
at thousands of jobs a second a claim walked hundreds of thousands of dead entries
in between (bench/scale.py). Each tick reads the table's statistics (one cheap
statement on the pool) and vacuums when it holds at least ``vacuum_dead_tuples``
dead versions, no vacuum ended in the last tick interval and none is under way. Any
process may vacuum; the table's own lock (VACUUM's SKIP_LOCKED) keeps two from
running at once, so no leadership is needed. A role that may not vacuum the table
(neither its owner nor the database's) logs that once and never tries.

A tick interval of ``VACUUM_EVERY`` rescuer intervals; stopping the service cancels
a VACUUM under way, so a worker's shutdown never waits for one.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine
from dataclasses import dataclass

from deadman import logs, metrics
from deadman.config import Settings
from deadman.maintenance.service import Service
from deadman.store import AsyncStore
from deadman.store.maintenance import VacuumLook, VacuumOutcome

log = logs.get("deadman.vacuumer")

#: The vacuumer ticks once per this many rescuer intervals (DEADMAN_RESCUE_S).
VACUUM_EVERY = 5


@dataclass
class VacuumReport:
    #: what the table looked like; None: the tick did not look (never allowed)
    look: VacuumLook | None = None
    #: what the VACUUM did; None: not due, or stopped before it ended
    outcome: VacuumOutcome | None = None
    seconds: float = 0.0


class Vacuumer(Service):
    name = "vacuumer"

    def __init__(self, store: AsyncStore, settings: Settings) -> None:
        super().__init__(settings.rescue_s * VACUUM_EVERY)
        self._store = store
        self.dead_tuples = settings.vacuum_dead_tuples
        #: False once the server said this role may not vacuum the table
        self.allowed = True

    def due(self, look: VacuumLook) -> bool:
        return (
            look.may_vacuum
            and not look.running
            and look.dead_tuples >= self.dead_tuples
            and (look.since_vacuum_s is None or look.since_vacuum_s >= self.interval_s)
        )

    async def tick(self) -> VacuumReport:
        if not self.allowed:
            return VacuumReport()
        look = await self._store.jobs_vacuum_look()
        report = VacuumReport(look)
        if not look.may_vacuum:
            self._refused()
            return report
        if not self.due(look):
            return report
        started = time.monotonic()
        report.outcome = await self._until_stopped(self._store.jobs_vacuum())
        report.seconds = round(time.monotonic() - started, 3)
        if report.outcome == "refused":
            self._refused()
        elif report.outcome == "vacuumed":
            metrics.JOBS_VACUUMS.inc()
            log.info("jobs_vacuumed", dead_tuples=look.dead_tuples, seconds=report.seconds)
        return report

    def _refused(self) -> None:
        self.allowed = False
        log.warning(
            "jobs_vacuum_refused",
            reason="this role owns neither deadman.jobs nor the database; "
            "autovacuum alone keeps the table (DEADMAN_VACUUM_DEAD_TUPLES=0 silences this)",
        )

    async def _until_stopped(
        self, vacuum: Coroutine[object, object, VacuumOutcome]
    ) -> VacuumOutcome | None:
        """``vacuum``'s outcome; None if the service was stopped first (the VACUUM is
        then cancelled, on the server too)."""
        task = asyncio.ensure_future(vacuum)
        stop = self._stop
        if stop is None:  # ticked directly, not started
            return await task
        stopped = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        return None if task.cancelled() else task.result()
