"""The maintenance services' statements (rescuer, expirer, cleaner), their parameters
(each above the function that turns it into its query's placeholders) and results,
and the transaction that holds maintenance leadership."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Literal, LiteralString

import psycopg
from psycopg.rows import DictRow

from deadman.db.queries import QUERIES
from deadman.errors import translate
from deadman.model import JobState
from deadman.store.async_base import AsyncBase
from deadman.store.conn import AsyncConn
from deadman.store.schedules import Firing

#: Leadership keys (rescuer_try_lock): one per maintenance service.
RESCUER_KEY, EXPIRER_KEY, CLEANER_KEY, SCHEDULER_KEY = 2, 3, 4, 5


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


def _rescue_args(p: RescueParams) -> dict[str, Any]:
    return {"max_rescues": p.max_rescues, "limit": p.limit}


@dataclass(frozen=True)
class PruneParams:
    succeeded_ms: int
    failed_ms: int
    limit: int = 1000


def _prune_args(p: PruneParams) -> dict[str, Any]:
    return {"succeeded_ms": p.succeeded_ms, "failed_ms": p.failed_ms, "limit": p.limit}


def _workflow_prune_args(p: PruneParams) -> dict[str, Any]:
    return {"keep_ms": max(p.succeeded_ms, p.failed_ms), "limit": p.limit}


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


@dataclass(frozen=True)
class VacuumLook:
    """What the vacuumer reads before it vacuums (query jobs_vacuum_due)."""

    dead_tuples: int
    #: since a vacuum of deadman.jobs (ours or autovacuum's) last ended; None: never
    since_vacuum_s: float | None
    #: a vacuum of the table is under way (visible to this role)
    running: bool
    #: this role owns the table or the database (or is a member of its owner)
    may_vacuum: bool

    @classmethod
    def from_row(cls, r: DictRow) -> VacuumLook:
        since = r["since_vacuum_s"]
        return cls(
            int(r["dead_tuples"]),
            None if since is None else float(since),
            bool(r["running"]),
            bool(r["may_vacuum"]),
        )


#: What one VACUUM did: ran; skipped, another vacuum held the table (SKIP_LOCKED);
#: skipped, this role may not vacuum it.
VacuumOutcome = Literal["vacuumed", "locked", "refused"]
#: SQLSTATE of VACUUM's "skipping vacuum of ... lock not available" warning
LOCK_NOT_AVAILABLE = "55P03"


class Cleaning:
    """The cleaner's statements, on whatever runs them: a leader's transaction
    (MaintenanceTx) or the pool, in autocommit and retried (MaintenanceStore)."""

    async def _all(self, name: LiteralString, params: dict[str, Any]) -> list[DictRow]:
        raise NotImplementedError

    async def job_prune_finished(self, p: PruneParams) -> int:
        return len(await self._all("job_prune_finished", _prune_args(p)))

    async def workflow_prune_finished(self, p: PruneParams) -> int:
        """Delete finished workflows with no node left; returns how many."""
        return len(await self._all("workflow_prune_finished", _workflow_prune_args(p)))

    async def worker_prune_stale(self, older_than_ms: int) -> None:
        await self._all("worker_prune_stale", {"older_than_ms": older_than_ms})


class MaintenanceTx(Cleaning, Firing):
    """The maintenance statements on one connection, inside its transaction: the one
    that holds leadership (MaintenanceStore.maintenance_lead)."""

    def __init__(self, conn: AsyncConn) -> None:
        self._conn = conn

    # named like AsyncBase._all, so tests/unit/test_queries_loader.py sees the names
    async def _all(self, name: LiteralString, params: dict[str, Any]) -> list[DictRow]:
        cur = await self._conn.execute(QUERIES[name], params)
        return await cur.fetchall() if cur.description else []

    async def job_rescue_expired(self, p: RescueParams) -> list[Rescued]:
        rows = await self._all("job_rescue_expired", _rescue_args(p))
        return [Rescued.from_row(r) for r in rows]

    async def job_expire(self, limit: int) -> list[Rescued]:
        """start_by / deadline passed before the job started: dead, not run."""
        return [Rescued.from_row(r) for r in await self._all("job_expire", {"limit": limit})]


class MaintenanceStore(AsyncBase, Cleaning):
    """Where the maintenance statements run: under leadership (the services), or
    directly (tests, the chaos harness's own pruner)."""

    @asynccontextmanager
    async def maintenance_lead(self, key: int, idle_ms: int) -> AsyncIterator[MaintenanceTx | None]:
        """A transaction holding the leadership ``key`` (rescuer_try_lock), or None when
        another process holds it. Leadership lasts as long as this transaction; a
        leader left idle in it longer than ``idle_ms`` loses its session (DECISIONS 24)."""
        with translate():
            async with self.pool.connection() as conn, conn.transaction():
                cur = await conn.execute(
                    QUERIES["rescuer_try_lock"], {"key": key, "idle_ms": idle_ms}
                )
                row = await cur.fetchone()
                yield MaintenanceTx(conn) if row and row["leader"] else None

    async def job_rescue_expired(self, p: RescueParams) -> list[Rescued] | None:
        """One rescue under leadership; None when another process holds it."""
        async with self.maintenance_lead(RESCUER_KEY, p.idle_ms) as tx:
            return None if tx is None else await tx.job_rescue_expired(p)

    # Without leadership (Cleaning's statements): one statement each in autocommit,
    # retried like any other (AsyncBase._all).

    async def jobs_vacuum_look(self) -> VacuumLook:
        rows = await self._all("jobs_vacuum_due", {})
        return VacuumLook.from_row(rows[0])

    async def jobs_vacuum(self) -> VacuumOutcome:
        """VACUUM deadman.jobs (query jobs_vacuum) on a connection of its own, made for
        it and closed after: a vacuum of a large table takes seconds, and a pooled
        connection held that long is one the heartbeat or the completer waits for.
        Not retried (the next tick is the retry). Cancelling the awaiting task cancels
        the VACUUM on the server (psycopg sends the cancel request)."""
        warnings: list[str] = []

        def heard(d: psycopg.errors.Diagnostic) -> None:
            if d.severity_nonlocalized == "WARNING":
                warnings.append(d.sqlstate or "")

        conninfo = self.pool.conninfo
        if callable(conninfo):  # a pool made with a conninfo function
            made = conninfo()
            conninfo = made if isinstance(made, str) else await made
        with translate():
            async with await psycopg.AsyncConnection.connect(
                conninfo, autocommit=True, prepare_threshold=None
            ) as conn:
                conn.add_notice_handler(heard)
                await conn.execute(QUERIES["jobs_vacuum"])
        if LOCK_NOT_AVAILABLE in warnings:
            return "locked"
        return "refused" if warnings else "vacuumed"
