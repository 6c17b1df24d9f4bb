"""The rescuer's and the cleaner's parameters and results."""

from __future__ import annotations

from dataclasses import dataclass

from psycopg.rows import DictRow

from deadman.db.queries import QUERIES
from deadman.errors import translate
from deadman.model import JobState
from deadman.store.async_base import AsyncBase


@dataclass(frozen=True)
class RescueParams:
    max_rescues: int
    limit: int = 1000
    #: a leader idle this long inside its tick's transaction loses its session
    idle_ms: int = 5000

    @property
    def quarantine_at(self) -> int:
        return quarantine_at(self.max_rescues)


def quarantine_at(max_rescues: int) -> int:
    """Rescues after which a job only runs alone (see job_rescue_expired)."""
    return max(max_rescues, 1)


@dataclass(frozen=True)
class PruneParams:
    succeeded_ms: int
    failed_ms: int
    limit: int = 1000


@dataclass(frozen=True)
class Rescued:
    id: int
    state: JobState
    queue: str
    #: the job and the lease that lapsed, for the log line (absent: not known)
    type: str = ""
    attempt: int = 0
    lease_token: int = 0
    worker: str = ""

    @classmethod
    def from_row(cls, r: DictRow) -> Rescued:
        return cls(
            int(r["id"]),
            JobState(r["state"]),
            r["queue"],
            r.get("type") or "",
            int(r.get("attempt") or 0),
            int(r.get("lease_token") or 0),
            r.get("lease_worker") or "",
        )


class MaintenanceStore(AsyncBase):
    """The rescuer's and the cleaner's statements."""

    async def worker_prune_stale(self, older_than_ms: int) -> None:
        await self._all("worker_prune_stale", {"older_than_ms": older_than_ms})

    # -- the rescuer ---------------------------------------------------------------

    async def job_rescue_expired(self, p: RescueParams) -> list[Rescued] | None:
        """One rescuer tick. Returns None when another process holds leadership."""
        with translate():
            async with self.pool.connection() as conn, conn.transaction():
                cur = await conn.execute(QUERIES["rescuer_try_lock"], {"idle_ms": p.idle_ms})
                row = await cur.fetchone()
                if not row or not row["leader"]:
                    return None
                cur = await conn.execute(
                    QUERIES["job_rescue_expired"],
                    {
                        "max_rescues": p.max_rescues,
                        "quarantine_at": p.quarantine_at,
                        "limit": p.limit,
                    },
                )
                rows = await cur.fetchall()
                # start_by / deadline passed before the job started: dead, not run
                cur = await conn.execute(QUERIES["job_expire"], {"limit": p.limit})
                rows += await cur.fetchall()
                return [Rescued.from_row(r) for r in rows]

    async def job_prune_finished(self, p: PruneParams) -> int:
        rows = await self._all(
            "job_prune_finished",
            {
                "succeeded_ms": p.succeeded_ms,
                "failed_ms": p.failed_ms,
                "limit": p.limit,
            },
        )
        return len(rows)

    async def workflow_prune_finished(self, p: PruneParams) -> int:
        """Delete finished workflows with no node left; returns how many."""
        rows = await self._all(
            "workflow_prune_finished",
            {"keep_ms": max(p.succeeded_ms, p.failed_ms), "limit": p.limit},
        )
        return len(rows)
