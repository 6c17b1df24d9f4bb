"""Async access for the worker and the API: one method per named query."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, LiteralString

import psycopg
from psycopg.rows import DictRow

from deadman.db.queries import QUERIES
from deadman.errors import translate
from deadman.model import (
    AttemptOutcome,
    Job,
    JobState,
)
from deadman.store.async_base import AsyncBase
from deadman.store.batches import (
    BatchInserted,
    batch_dependencies,
    batch_edges,
    batch_params,
    batch_verdicts,
    match_batch,
)
from deadman.store.conn import AsyncConn
from deadman.store.jobs import NewJob, deps_verdict
from deadman.store.leases import (
    FINISH_IDLE_MS,
    ClaimParams,
    Finish,
    HeartbeatParams,
    claim_params,
    finish_params,
    heartbeat_params,
)
from deadman.store.maintenance import PruneParams, Rescued, RescueParams
from deadman.store.reads import FINISHED_COUNT_CAP, ListParams, _ms
from deadman.store.workflows import NewWorkflow, workflow_params


class AsyncStore(AsyncBase):
    """Async access for the worker and the API (see AsyncBase for how statements run)."""

    # -- enqueue and read ----------------------------------------------------------

    async def job_insert(self, job: NewJob, default_max_attempts: int) -> Job | None:
        if job.depends_on:
            return await self._job_insert_with_deps(job, default_max_attempts)
        # Without an idempotency key a retry after a lost COMMIT acknowledgement would
        # insert the job twice, so only keyed inserts are retried.
        rows = await self._all(
            "job_insert",
            job.params(default_max_attempts),
            retry_s=None if job.idempotency_key else 0,
        )
        return Job.from_row(rows[0]) if rows else None

    async def _job_insert_with_deps(self, job: NewJob, default_max_attempts: int) -> Job | None:
        """Lock the dependencies, insert the job, insert its edges: one transaction."""
        deps = list(job.depends_on)
        with translate():
            async with self.pool.connection() as conn, conn.transaction():
                cur = await conn.execute(QUERIES["job_deps_lock"], {"ids": deps})
                pending, upstream = deps_verdict(deps, await cur.fetchall())
                cur = await conn.execute(
                    QUERIES["job_insert"],
                    job.params(
                        default_max_attempts,
                        pending_deps=pending,
                        upstream_error=upstream,
                    ),
                )
                row = await cur.fetchone()
                if row is None:
                    return None
                await conn.execute(
                    QUERIES["job_deps_insert"],
                    {"job_id": row["id"], "depends_on": deps},
                )
                return Job.from_row(row)

    async def job_get(self, job_id: int) -> Job | None:
        rows = await self._all("job_get", {"id": job_id})
        return Job.from_row(rows[0]) if rows else None

    async def job_get_many(self, ids: Sequence[int]) -> list[Job]:
        rows = await self._all("job_get_many", {"ids": list(ids)})
        return [Job.from_row(r) for r in rows]

    async def job_attempts(self, job_id: int) -> list[DictRow]:
        return await self._all("job_attempts", {"id": job_id})

    # -- the worker's path ---------------------------------------------------------

    async def job_claim(self, p: ClaimParams, retry_s: float | None = None) -> list[Job]:
        rows = await self._all("job_claim", claim_params(p), retry_s)
        return await self._readable(rows)

    async def job_claim_quarantined(
        self, p: ClaimParams, retry_s: float | None = None
    ) -> list[Job]:
        """At most one quarantined job; only for a worker that holds nothing else."""
        rows = await self._all("job_claim_quarantined", claim_params(p), retry_s)
        return await self._readable(rows)

    async def _readable(self, rows: Sequence[DictRow]) -> list[Job]:
        """The claimed rows as jobs. A row this code cannot read (a backoff or payload
        written by hand, or by a newer version) ends dead at once, fenced by the
        token just taken, with the reason; its batch-mates are claimed as usual.
        Raising instead lost the whole batch's claim to the rescuer, a rescue
        counted against every job in it."""
        jobs: list[Job] = []
        broken: list[Finish] = []
        for r in rows:
            try:
                jobs.append(Job.from_row(r))
            except Exception as exc:
                error = f"the job row cannot be read by this worker: {exc!r}"[:2000]
                outcome = AttemptOutcome.FAILED
                broken.append(
                    Finish(
                        int(r["id"]),
                        int(r["lease_token"]),
                        JobState.DEAD,
                        outcome,
                        error=error,
                    )
                )
        if broken:
            await self.job_finish_many(broken)
        return jobs

    async def job_quarantine_pending(self, queues: Sequence[str], quarantine_at: int) -> bool:
        rows = await self._all(
            "job_quarantine_pending",
            {"queues": list(queues), "quarantine_at": quarantine_at},
        )
        return bool(rows and rows[0]["pending"])

    async def job_next_run_at(self, queue: str) -> float | None:
        """Milliseconds until the queue's next not-yet-due job, or None if there is none."""
        rows = await self._all("job_next_run_at", {"queue": queue})
        return _ms(rows[0]["wait"]) if rows else None

    async def job_finish_many(self, finishes: Sequence[Finish]) -> set[int]:
        """End attempts; returns the ids that were still ours. Missing ids: lease lost."""
        if not finishes:
            return set()
        # Prepared: its generic plan goes through the primary key and is the fastest
        # at every batch size (DECISIONS.md 25).
        rows = await self._all("job_finish_many", finish_params(finishes))
        return {int(r["id"]) for r in rows}

    async def job_finish_in(
        self, conn: AsyncConn, finishes: Sequence[Finish], idle_ms: int = FINISH_IDLE_MS
    ) -> set[int]:
        """Like job_finish_many, on the caller's connection and inside its transaction,
        which the server ends if it then sits idle for ``idle_ms`` (tx_idle_limit)."""
        with translate():
            # Two round trips: in pipeline mode the server did not arm the idle timer.
            await conn.execute(QUERIES["tx_idle_limit"], {"idle_ms": idle_ms})
            cur = await conn.execute(QUERIES["job_finish_many"], finish_params(finishes))
            return {int(r["id"]) for r in await cur.fetchall()}

    async def job_heartbeat_many(
        self, p: HeartbeatParams, retry_s: float | None = None
    ) -> dict[int, bool]:
        """Renew leases; returns {job id: cancel requested} for the leases still ours."""
        rows = await self._all("job_heartbeat_many", heartbeat_params(p), retry_s)
        return {int(r["id"]): bool(r["cancel_requested"]) for r in rows}

    async def worker_deregister(self, worker: str) -> None:
        await self._all("worker_deregister", {"worker": worker})

    async def worker_prune_stale(self, older_than_ms: int) -> None:
        await self._all("worker_prune_stale", {"older_than_ms": older_than_ms})

    async def queue_notify(self, queues: Sequence[str]) -> None:
        if queues:
            await self._all("queue_notify", {"queues": sorted(set(queues))})

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

    async def lease_refusal_record(
        self, worker: str, action: str, leases: Sequence[tuple[int, int]]
    ) -> None:
        """Record refused writes; best effort (the refusal itself already protected us)."""
        if leases:
            await self._all(
                "lease_refusal_record",
                {
                    "ids": [i for i, _ in leases],
                    "tokens": [t for _, t in leases],
                    "workers": [worker] * len(leases),
                    "actions": [action] * len(leases),
                },
            )

    async def effect_insert(self, conn: AsyncConn, job_id: int, lease_token: int) -> None:
        with translate():
            await conn.execute(
                QUERIES["effect_insert"], {"job_id": job_id, "lease_token": lease_token}
            )

    # -- the HTTP API --------------------------------------------------------------

    async def job_get_by_idempotency_key(self, key: str) -> Job | None:
        rows = await self._all("job_get_by_idempotency_key", {"idempotency_key": key})
        return Job.from_row(rows[0]) if rows else None

    async def job_get_many_by_idempotency_key(self, keys: Sequence[str]) -> list[Job]:
        """The jobs holding any of ``keys`` (one read, the unique key index)."""
        rows = await self._all("job_get_many_by_idempotency_key", {"keys": list(keys)})
        return [Job.from_row(r) for r in rows]

    async def job_insert_many_returning(
        self, jobs: Sequence[NewJob], default_max_attempts: int
    ) -> BatchInserted:
        """Insert ``jobs`` in one transaction: all of them, or none.

        A job whose idempotency key is already taken is a replay when the existing
        job was made from the same request (it is returned, ``created`` False); when
        not, the whole transaction is rolled back and its index is reported in
        ``mismatched``. Keys must be unique within ``jobs`` (the caller checks).
        """
        keys = [j.idempotency_key for j in jobs if j.idempotency_key is not None]
        deps = batch_dependencies(jobs)
        # A replayed row deleted by retention between our two statements would look
        # like a reused key; the whole transaction is tried again (then it inserts).
        for _ in range(3):
            with translate():
                async with self.pool.connection() as conn, conn.transaction():
                    verdicts = None
                    if deps:  # lock them first, as job_insert does (job_deps_lock)
                        cur = await conn.execute(QUERIES["job_deps_lock"], {"ids": deps})
                        verdicts = batch_verdicts(jobs, await cur.fetchall())
                    params = batch_params(jobs, default_max_attempts, verdicts)
                    cur = await conn.execute(QUERIES["job_insert_many_returning"], params)
                    inserted = [Job.from_row(r) for r in await cur.fetchall()]
                    existing: list[Job] = []
                    if len(inserted) < len(jobs) and keys:
                        cur = await conn.execute(
                            QUERIES["job_get_many_by_idempotency_key"], {"keys": keys}
                        )
                        existing = [Job.from_row(r) for r in await cur.fetchall()]
                    result = match_batch(jobs, inserted, existing)
                    if result.mismatched or result.vanished:
                        raise psycopg.Rollback()  # caught by conn.transaction(): rolled back
                    if deps:
                        await conn.execute(
                            QUERIES["job_deps_insert_many"], batch_edges(jobs, result)
                        )
            if not result.vanished:
                return result
        return result

    async def job_list(self, p: ListParams) -> list[Job]:
        """One page, newest first; unprepared on purpose (see the query's comment)."""
        params = {
            "state": p.state.value if p.state else None,
            "type": p.type,
            "queue": p.queue,
            "before": p.before_id,
            "limit": p.limit,
        }
        with translate():
            async with self.pool.connection() as conn:
                cur = await conn.execute(QUERIES["job_list"], params, prepare=False)
                return [Job.from_row(r) for r in await cur.fetchall()]

    async def job_cancel(self, job_id: int) -> Job | None:
        rows = await self._all("job_cancel", {"id": job_id})
        return Job.from_row(rows[0]) if rows else None

    # -- workflows -------------------------------------------------------------------

    async def workflow_insert(
        self, wf: NewWorkflow, default_max_attempts: int
    ) -> tuple[DictRow, list[Job]] | None:
        """The workflow, its nodes and its edges in one statement; None when its
        idempotency key is taken (then read :meth:`workflow_get_by_idempotency_key`)."""
        return await self._workflow_with_nodes(
            "workflow_insert", workflow_params(wf, default_max_attempts)
        )

    async def workflow_get_by_idempotency_key(self, key: str) -> tuple[DictRow, list[Job]] | None:
        return await self._workflow_with_nodes(
            "workflow_get_by_idempotency_key", {"idempotency_key": key}
        )

    async def workflow_get(self, workflow_id: int) -> tuple[DictRow, list[Job]] | None:
        return await self._workflow_with_nodes("workflow_get", {"id": workflow_id})

    async def _workflow_with_nodes(
        self, name: LiteralString, params: dict[str, Any]
    ) -> tuple[DictRow, list[Job]] | None:
        """``name`` returns (or inserts and returns) one workflow row; its nodes are read
        in the same transaction, so row and nodes are one snapshot."""
        with translate():
            async with self.pool.connection() as conn, conn.transaction():
                cur = await conn.execute(QUERIES[name], params)
                row = await cur.fetchone()
                if row is None:
                    return None
                cur = await conn.execute(QUERIES["workflow_nodes"], {"id": row["id"]})
                return row, [Job.from_row(r) for r in await cur.fetchall()]

    async def workflow_cancel(self, workflow_id: int) -> list[DictRow]:
        """Cancel the unfinished nodes; returns (id, state) of those it touched."""
        return await self._all("workflow_cancel", {"id": workflow_id})

    async def job_retry(self, job_id: int) -> Job | None:
        rows = await self._all("job_retry", {"id": job_id})
        return Job.from_row(rows[0]) if rows else None

    async def job_retry_refusal(self, job_id: int) -> str | None:
        """Why job_retry returned nothing, in words; None when there is no such job."""
        job = await self.job_get(job_id)
        if job is None:
            return None
        blocking = await self._all("job_blocking_deps", {"id": job_id})
        if job.state in (JobState.DEAD, JobState.CANCELLED) and blocking:
            names = ", ".join(f"{r['name']} ({r['state']})" for r in blocking)
            return (
                f"job {job_id} depends on {names}: retry that first; the jobs it "
                "cancelled reopen with it"
            )
        return f"job {job_id} is {job.state.value}; only dead or cancelled jobs can be retried"

    async def queue_depth_get(self, queue: str, cap: int) -> int:
        """Jobs waiting in ``queue``, counted up to ``cap`` at most."""
        rows = await self._all("queue_depth_get", {"queue": queue, "cap": cap})
        return int(rows[0]["n"])

    async def queue_list(self) -> list[DictRow]:
        return await self._all("queue_list", {})

    async def queue_set_paused(self, name: str, paused: bool) -> DictRow:
        rows = await self._all("queue_set_paused", {"name": name, "paused": paused})
        return rows[0]

    async def worker_list(self, ttl_ms: int) -> list[DictRow]:
        return await self._all("worker_list", {"ttl_ms": ttl_ms})

    async def job_counts_finished(self, cap: int = FINISHED_COUNT_CAP) -> list[DictRow]:
        """(state, n, estimated) for succeeded, dead, cancelled: exact up to ``cap``."""
        return await self._all("job_counts_finished", {"cap": cap})

    async def xmin_horizon_age(self) -> int:
        """Transactions since the oldest one still running began (see the query)."""
        rows = await self._all("xmin_horizon_age", {})
        return int(rows[0]["age"])

    # -- operating (CLI, dashboard, metrics) ---------------------------------------

    async def job_retry_dead_many(
        self, type: str | None, queue: str | None, batch: int = 1000
    ) -> list[int]:
        """Replay every dead job matching the filters (None: any), ``batch`` rows per
        transaction; returns the replayed ids. Unprepared, as job_list."""
        done: list[int] = []
        after: int | None = None
        while True:
            params = {"type": type, "queue": queue, "after": after, "limit": batch}
            with translate():
                async with self.pool.connection() as conn:
                    cur = await conn.execute(QUERIES["job_retry_dead_many"], params, prepare=False)
                    rows = await cur.fetchall()
            done += [int(r["id"]) for r in rows if r["replayed"]]
            if len(rows) < batch:
                return done
            after = int(rows[-1]["id"])

    async def throughput_recent(self, minutes: int) -> list[DictRow]:
        return await self._all("throughput_recent", {"minutes": minutes})

    async def schema_version_get(self) -> int | None:
        rows = await self._all("schema_version_get", {})
        version = rows[0]["version"] if rows else None
        return None if version is None else int(version)
