"""The expirer: jobs whose start_by or deadline passed before they started end dead
without running (the claim already skips them; this makes the verdict visible)."""

from __future__ import annotations

from deadman.maintenance.rescuer import VerdictService
from deadman.store.maintenance import EXPIRER_KEY, MaintenanceTx, Rescued

#: Most jobs one tick expires (per reason); the rest wait for the next tick.
EXPIRE_LIMIT = 1000


class Expirer(VerdictService):
    """Ticks as often as the rescuer (job_expire's comment promises one tick at most);
    its verdicts are all dead, logged as the rescuer logged them before the split."""

    name = "expirer"
    key = EXPIRER_KEY

    async def verdicts(self, tx: MaintenanceTx) -> list[Rescued]:
        return await tx.job_expire(EXPIRE_LIMIT)
