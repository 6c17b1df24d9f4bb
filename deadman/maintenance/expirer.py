"""The expirer: jobs whose start_by or deadline passed before they started end dead
without running (the claim already skips them; this makes the verdict visible)."""

from __future__ import annotations

from deadman.config import Settings
from deadman.maintenance.leadership import Leadership
from deadman.maintenance.rescuer import RescueReport, log_rescued
from deadman.maintenance.service import Service
from deadman.store import AsyncStore
from deadman.store.maintenance import EXPIRER_KEY

#: Most jobs one tick expires (per reason); the rest wait for the next tick.
EXPIRE_LIMIT = 1000


class Expirer(Service):
    name = "expirer"

    def __init__(
        self, store: AsyncStore, settings: Settings, leadership: Leadership | None = None
    ) -> None:
        # as often as the rescuer: job_expire's comment promises one tick at most
        super().__init__(settings.rescue_s)
        self.leadership = leadership or Leadership(store)

    async def tick(self) -> RescueReport:
        async with self.leadership.lead(EXPIRER_KEY) as tx:
            if tx is None:
                return RescueReport(leader=False)
            expired = await tx.job_expire(EXPIRE_LIMIT)
        report = RescueReport(leader=True)
        log_rescued(expired, report)  # what the rescuer logged for them before the split
        return report
