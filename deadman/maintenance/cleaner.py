"""The cleaner: retention. Deletes finished jobs and workflows past their retention,
and forgets workers that stopped sending heartbeats long ago."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from deadman import logs, metrics
from deadman.config import Settings
from deadman.maintenance.leadership import Leadership
from deadman.maintenance.service import MaintenanceService
from deadman.store import AsyncStore, PruneParams
from deadman.store.maintenance import CLEANER_KEY, MaintenanceTx

log = logs.get("deadman.cleaner")

#: Prune batches per round at most (each deletes up to 2 x PruneParams.limit).
PRUNE_BATCHES_MAX = 50
#: The cleaner ticks once per this many rescuer intervals (the old prune_every).
CLEAN_EVERY = 10


@dataclass
class CleanReport:
    leader: bool
    pruned: int = 0
    workflows_pruned: int = 0


class Cleaner(MaintenanceService):
    name = "cleaner"
    key = CLEANER_KEY
    every = CLEAN_EVERY

    def __init__(
        self, store: AsyncStore, settings: Settings, leadership: Leadership | None = None
    ) -> None:
        super().__init__(store, settings, leadership)
        self._prune = PruneParams(
            succeeded_ms=int(settings.retention_succeeded_s * 1000),
            failed_ms=int(settings.retention_failed_s * 1000),
        )
        self._stale_worker_ms = int(max(settings.lease_ttl_s * 10, 300) * 1000)

    async def tick(self) -> CleanReport:
        # One batch per round capped pruning at `limit` jobs per round (100 jobs/s by
        # default): a queue finishing more than that grew without bound (measured:
        # bench/retention.py). Batches stay short transactions, each under leadership
        # of its own; the round ends when one comes back short, or after
        # PRUNE_BATCHES_MAX.
        report = CleanReport(leader=True)
        pruned = await self._in_batches(lambda tx: tx.job_prune_finished(self._prune))
        if pruned is None:
            return CleanReport(leader=False)
        report.pruned = pruned
        if pruned:
            metrics.JOBS_PRUNED.inc(pruned)
            log.info("jobs_pruned", count=pruned)
        workflows = await self._in_batches(lambda tx: tx.workflow_prune_finished(self._prune))
        report.workflows_pruned = workflows or 0
        if workflows:
            log.info("workflows_pruned", count=workflows)
        async with self.leadership.lead(self.key) as tx:
            if tx is not None:
                await tx.worker_prune_stale(self._stale_worker_ms)
        return report

    async def _in_batches(self, prune: Callable[[MaintenanceTx], Awaitable[int]]) -> int | None:
        """Run one prune statement, a transaction per batch, until a batch comes back
        short (or PRUNE_BATCHES_MAX); None if another process led the first batch."""
        total = 0
        for batch in range(PRUNE_BATCHES_MAX):
            async with self.leadership.lead(self.key) as tx:
                if tx is None:
                    return None if batch == 0 else total
                n = await prune(tx)
            total += n
            if n < self._prune.limit:
                break
        return total
