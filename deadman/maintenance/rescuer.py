"""The rescuer: hands lapsed leases back, retires poison pills, ends cancelled jobs
whose worker vanished (the verdicts are the query job_rescue_expired's)."""

from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass, field

from deadman import logs, metrics
from deadman.maintenance.service import MaintenanceService
from deadman.model import JobState
from deadman.store import RescueParams
from deadman.store.maintenance import RESCUER_KEY, MaintenanceTx, Rescued

log = logs.get("deadman.rescuer")


@dataclass
class RescueReport:
    leader: bool
    requeued: list[int] = field(default_factory=list)
    dead: list[int] = field(default_factory=list)
    cancelled: list[int] = field(default_factory=list)


def log_rescued(rescued: list[Rescued], report: RescueReport) -> None:
    """Sort each verdict into the report, count it and log it (one line per job)."""
    for r in rescued:
        if r.state is JobState.QUEUED:
            report.requeued.append(r.id)
        elif r.state is JobState.DEAD:
            report.dead.append(r.id)
        else:
            report.cancelled.append(r.id)
        metrics.JOBS_RESCUED.labels(r.state.value).inc()
        log.warning(
            "job_rescued",
            job_id=r.id,
            type=r.type,
            queue=r.queue,
            attempt=r.attempt,
            lease_token=r.lease_token,
            worker=r.worker,  # the worker whose lease lapsed ("" for an expiry)
            to=r.state.value,
        )


class VerdictService(MaintenanceService):
    """A service whose leader's tick gives jobs a verdict (the rescuer, the expirer):
    each sorted into the report, counted and logged; producers woken for jobs that
    are queued again."""

    @abstractmethod
    async def verdicts(self, tx: MaintenanceTx) -> list[Rescued]:
        """This tick's statement, in the leader's transaction."""

    async def tick(self) -> RescueReport:
        async with self.leadership.lead(self.key) as tx:
            if tx is None:
                return RescueReport(leader=False)
            rescued = await self.verdicts(tx)
        report = RescueReport(leader=True)
        log_rescued(rescued, report)
        if report.requeued:
            # after the commit: a woken producer must find the jobs queued
            await self._store.queue_notify([r.queue for r in rescued if r.state is JobState.QUEUED])
        return report


class Rescuer(VerdictService):
    name = "rescuer"
    key = RESCUER_KEY

    async def verdicts(self, tx: MaintenanceTx) -> list[Rescued]:
        return await tx.job_rescue_expired(RescueParams(max_rescues=self._settings.max_rescues))
