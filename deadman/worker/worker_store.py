"""WorkerStore: what a worker's producer, heartbeat, completer and executor ask of
the store (the LeaseStore statements), so a test can hand a Worker any store that
records, delays or fails them, without monkeypatching."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from deadman.model import Job
from deadman.store import AsyncConn, Claimed, ClaimParams, Finish, HeartbeatParams


class WorkerStore(Protocol):
    async def open(self, wait: bool = True, timeout: float = 30.0) -> None: ...
    async def close(self) -> None: ...

    # producer
    async def job_claim(self, p: ClaimParams, retry_s: float | None = None) -> Claimed: ...
    async def job_claim_quarantined(
        self, p: ClaimParams, retry_s: float | None = None
    ) -> list[Job]: ...
    async def job_quarantine_pending(self, queues: Sequence[str], quarantine_at: int) -> bool: ...

    # completer and executor (ctx.transaction() finishes on the handler's connection)
    async def job_finish_many(self, finishes: Sequence[Finish]) -> set[int]: ...
    async def job_finish_claim(
        self, finishes: Sequence[Finish], claim: ClaimParams
    ) -> tuple[set[int], list[Job]]: ...
    async def job_finish_in(
        self, conn: AsyncConn, finishes: Sequence[Finish], idle_ms: int = ...
    ) -> set[int]: ...
    async def lease_refusal_record(
        self, worker: str, action: str, leases: Sequence[tuple[int, int]]
    ) -> None: ...

    # heartbeat
    async def job_heartbeat_many(
        self, p: HeartbeatParams, retry_s: float | None = None
    ) -> dict[int, bool]: ...

    # the process itself: wake producers after a release, deregister on the way out
    async def queue_notify(self, queues: Sequence[str]) -> None: ...
    async def worker_deregister(self, worker: str) -> None: ...
