"""The rescuer: hands expired leases back, retires poison pills, prunes old jobs.

It runs inside every worker process (and standalone as ``deadman rescuer``), but
each tick only the process that wins a transaction-level advisory lock acts; the
others skip. Leadership therefore needs no state and no hand-over: a leader that
dies mid-tick releases the lock with its connection, and the next tick elects
whoever comes first.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from deadman import logs, metrics
from deadman.config import Settings
from deadman.errors import DatabaseUnavailable
from deadman.model import JobState
from deadman.store import AsyncStore, PruneParams, RescueParams

log = logs.get("deadman.rescuer")


@dataclass
class TickReport:
    leader: bool
    requeued: list[int] = field(default_factory=list)
    dead: list[int] = field(default_factory=list)
    cancelled: list[int] = field(default_factory=list)
    pruned: int = 0
    workflows_pruned: int = 0


#: Prune batches per prune round at most (each deletes up to 2 x PruneParams.limit).
PRUNE_BATCHES_MAX = 50


class Rescuer:
    def __init__(self, store: AsyncStore, settings: Settings, *, prune_every: int = 10) -> None:
        self._store = store
        self._settings = settings
        self._stop = asyncio.Event()
        self._prune_every = prune_every
        self.ticks = 0

    def stop(self) -> None:
        self._stop.set()

    async def run(self) -> None:
        while not self._stop.is_set():
            try:
                await self.tick()
            except DatabaseUnavailable as exc:
                log.warning("rescuer_db_unavailable", error=str(exc))
            except Exception as exc:
                # A bug or an unexpected database error must not end the rescuer: a
                # standalone `deadman rescuer` would exit and nobody would rescue.
                log.error("rescuer_error", error=repr(exc)[:500])
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), self._settings.rescue_s)

    async def tick(self) -> TickReport:
        self.ticks += 1
        rescued = await self._store.job_rescue_expired(
            RescueParams(max_rescues=self._settings.max_rescues)
        )
        if rescued is None:
            return TickReport(leader=False)
        report = TickReport(leader=True)
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
                worker=r.worker,  # the worker whose lease lapsed
                to=r.state.value,
            )
        if report.requeued:
            await self._store.queue_notify([r.queue for r in rescued if r.state is JobState.QUEUED])
        if (self.ticks - 1) % self._prune_every == 0:
            prune = PruneParams(
                succeeded_ms=int(self._settings.retention_succeeded_s * 1000),
                failed_ms=int(self._settings.retention_failed_s * 1000),
            )
            # One batch per round capped pruning at `limit` jobs per prune_every ticks
            # (100 jobs/s by default): a queue finishing more than that grew without
            # bound (measured: bench/retention.py). Batches stay short transactions;
            # the round ends when one comes back short, or after PRUNE_BATCHES_MAX.
            report.pruned = await _in_batches(self._store.job_prune_finished, prune)
            if report.pruned:
                metrics.JOBS_PRUNED.inc(report.pruned)
                log.info("jobs_pruned", count=report.pruned)
            report.workflows_pruned = await _in_batches(self._store.workflow_prune_finished, prune)
            if report.workflows_pruned:
                log.info("workflows_pruned", count=report.workflows_pruned)
            await self._store.worker_prune_stale(
                int(max(self._settings.lease_ttl_s * 10, 300) * 1000)
            )
        return report


async def _in_batches(prune: Callable[[PruneParams], Awaitable[int]], p: PruneParams) -> int:
    """Run one prune statement until a batch comes back short (or PRUNE_BATCHES_MAX)."""
    total = 0
    for _ in range(PRUNE_BATCHES_MAX):
        n = await prune(p)
        total += n
        if n < p.limit:
            break
    return total
