"""Async access for the worker and the API: one method per named query."""

from __future__ import annotations

from collections.abc import Sequence

import psycopg
from psycopg.rows import DictRow

from deadman import bounds
from deadman.db.queries import QUERIES
from deadman.errors import translate
from deadman.model import Job
from deadman.store import batches, plans
from deadman.store.handoffs import HandoffStore
from deadman.store.jobs import NewJob
from deadman.store.limits import LimitStore
from deadman.store.maintenance import MaintenanceStore
from deadman.store.plans import WorkflowRows, jobs_of
from deadman.store.reads import FINISHED_COUNT_CAP, JobPage, ListParams, job_page
from deadman.store.schedules import ScheduleStore
from deadman.store.workflows import NewWorkflow


class AsyncStore(HandoffStore, MaintenanceStore, LimitStore, ScheduleStore):
    """Async access for the worker and the API (see AsyncBase for how statements run)."""

    # -- enqueue and read ----------------------------------------------------------

    async def job_insert(self, job: NewJob, default_max_attempts: int) -> Job | None:
        # Without an idempotency key a retry after a lost COMMIT acknowledgement would
        # insert the job twice, so only keyed inserts are retried; and never one with
        # dependencies (its transaction's outcome is as unknown).
        retried = job.idempotency_key is not None and not job.depends_on
        # its own transaction on the store's pool: a parked worker may take it
        return await self._plan(
            plans.job_insert(job, default_max_attempts, handoff=True),
            retry_s=None if retried else 0,
        )

    async def job_get(self, job_id: int) -> Job | None:
        return await self._plan(plans.job_get(job_id))

    async def job_get_many(self, ids: Sequence[int]) -> list[Job]:
        return jobs_of(await self._all("job_get_many", {"ids": list(ids)}))

    async def job_attempts(self, job_id: int) -> list[DictRow]:
        return await self._all("job_attempts", {"id": job_id})

    # -- the HTTP API --------------------------------------------------------------

    async def job_get_by_idempotency_key(self, key: str) -> Job | None:
        return await self._plan(plans.job_get_by_idempotency_key(key))

    async def job_get_many_by_idempotency_key(self, keys: Sequence[str]) -> list[Job]:
        """The jobs holding any of ``keys`` (one read, the unique key index)."""
        return jobs_of(await self._all("job_get_many_by_idempotency_key", {"keys": list(keys)}))

    async def job_insert_many_returning(
        self, jobs: Sequence[NewJob], default_max_attempts: int
    ) -> batches.BatchInserted:
        """Insert ``jobs`` in one transaction: all of them, or none.

        A job whose idempotency key is already taken is a replay when the existing
        job was made from the same request (it is returned, ``created`` False); when
        not, the whole transaction is rolled back and its index is reported in
        ``mismatched``. Keys must be unique within ``jobs`` (the caller checks).
        """
        keys = [j.idempotency_key for j in jobs if j.idempotency_key is not None]
        deps = batches.batch_dependencies(jobs)
        # A replayed row deleted by retention between our two statements would look
        # like a reused key; the whole transaction is tried again (then it inserts).
        for _ in range(3):
            with translate():
                async with self.pool.connection() as conn, conn.transaction():
                    verdicts = None
                    if deps:  # lock them first, as job_insert does (job_deps_lock)
                        cur = await conn.execute(QUERIES["job_deps_lock"], {"ids": deps})
                        verdicts = batches.batch_verdicts(jobs, await cur.fetchall())
                    params = batches.batch_params(jobs, default_max_attempts, verdicts)
                    cur = await conn.execute(QUERIES["job_insert_many_returning"], params)
                    inserted = jobs_of(await cur.fetchall())
                    existing: list[Job] = []
                    if len(inserted) < len(jobs) and keys:
                        cur = await conn.execute(
                            QUERIES["job_get_many_by_idempotency_key"], {"keys": keys}
                        )
                        existing = jobs_of(await cur.fetchall())
                    result = batches.match_batch(jobs, inserted, existing)
                    if result.mismatched or result.vanished:
                        raise psycopg.Rollback()  # caught by conn.transaction(): rolled back
                    if deps:
                        await conn.execute(
                            QUERIES["job_deps_insert_many"], batches.batch_edges(jobs, result)
                        )
            if not result.vanished:
                return result
        return result

    async def job_list(self, p: ListParams) -> JobPage:
        """One page, newest first, and the next page's cursor; unprepared on purpose
        (see the query's comment). A windowed page (migration 0020) first finds where
        its window ends, on the same connection."""
        with translate():
            async with self.pool.connection() as conn:
                floor = None
                if p.windowed:
                    cur = await conn.execute(
                        QUERIES["job_list_floor"],
                        {"before": p.before_id, "window": bounds.LIST_WINDOW},
                        prepare=False,
                    )
                    row = await cur.fetchone()
                    floor = None if row is None else int(row["floor"])
                params = {
                    "state": p.state.value if p.state else None,
                    "type": p.type,
                    "queue": p.queue,
                    "before": p.before_id,
                    "floor": floor,
                    "limit": p.limit + 1,
                }
                cur = await conn.execute(QUERIES["job_list"], params, prepare=False)
                return job_page(jobs_of(await cur.fetchall()), p.limit, floor)

    async def job_cancel(self, job_id: int) -> Job | None:
        return await self._plan(plans.job_cancel(job_id))

    # -- workflows (not retried: as a job with dependencies) ---------------------------

    async def workflow_insert(
        self, wf: NewWorkflow, default_max_attempts: int
    ) -> WorkflowRows | None:
        """See :func:`deadman.store.plans.workflow_insert`."""
        return await self._plan(plans.workflow_insert(wf, default_max_attempts), retry_s=0)

    async def workflow_get_by_idempotency_key(self, key: str) -> WorkflowRows | None:
        return await self._plan(plans.workflow_get_by_idempotency_key(key), retry_s=0)

    async def workflow_get(self, workflow_id: int) -> WorkflowRows | None:
        return await self._plan(plans.workflow_get(workflow_id), retry_s=0)

    async def workflow_cancel(self, workflow_id: int) -> list[DictRow]:
        """Cancel the unfinished nodes; returns (id, state) of those it touched."""
        return await self._all("workflow_cancel", {"id": workflow_id})

    async def job_retry(self, job_id: int) -> Job | None:
        return await self._plan(plans.job_retry(job_id))

    async def job_retry_refusal(self, job_id: int) -> str | None:
        """Why job_retry returned nothing, in words; None when there is no such job."""
        return await self._plan(plans.job_retry_refusal(job_id))

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
