"""Sync access on a connection the caller owns (the Python client, sync handlers'
ctx.transaction()): an enqueue joins the caller's own transaction."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, LiteralString

import psycopg
from psycopg.rows import DictRow, dict_row, tuple_row

from deadman.db.queries import QUERIES
from deadman.errors import DatabaseUnavailable, translate
from deadman.model import (
    Job,
    Workflow,
)
from deadman.store.batches import batch_dependencies
from deadman.store.conn import SyncConn
from deadman.store.jobs import NewJob, deps_verdict
from deadman.store.leases import FINISH_IDLE_MS, Finish, finish_params
from deadman.store.limits import Limit, LimitParams, limit_params, limits_of, list_params
from deadman.store.workflows import NewWorkflow, workflow_params


class SyncStore:
    """Sync access on a connection the caller owns (and whose transaction it controls)."""

    def job_insert(self, conn: SyncConn, job: NewJob, default_max_attempts: int) -> Job | None:
        """With depends_on, needs a transaction (the caller's, else one of its own)."""
        if not job.depends_on:
            with translate(), conn.cursor(row_factory=dict_row) as cur:
                cur.execute(QUERIES["job_insert"], job.params(default_max_attempts))
                row = cur.fetchone()
                return Job.from_row(row) if row else None
        if conn.autocommit:
            with conn.transaction():
                return self._job_insert_with_deps(conn, job, default_max_attempts)
        # Inside the caller's transaction: theirs to commit or roll back.
        return self._job_insert_with_deps(conn, job, default_max_attempts)

    def _job_insert_with_deps(
        self, conn: SyncConn, job: NewJob, default_max_attempts: int
    ) -> Job | None:
        deps = list(job.depends_on)
        with translate(), conn.cursor(row_factory=dict_row) as cur:
            cur.execute(QUERIES["job_deps_lock"], {"ids": deps})
            pending, upstream = deps_verdict(deps, cur.fetchall())
            cur.execute(
                QUERIES["job_insert"],
                job.params(
                    default_max_attempts,
                    pending_deps=pending,
                    upstream_error=upstream,
                ),
            )
            row = cur.fetchone()
            if row is None:
                return None
            cur.execute(QUERIES["job_deps_insert"], {"job_id": row["id"], "depends_on": deps})
            return Job.from_row(row)

    def workflow_insert(
        self, conn: SyncConn, wf: NewWorkflow, default_max_attempts: int
    ) -> Workflow | None:
        """As AsyncStore.workflow_insert, on the caller's connection (and transaction)."""
        with translate(), conn.cursor(row_factory=dict_row) as cur:
            cur.execute(QUERIES["workflow_insert"], workflow_params(wf, default_max_attempts))
            row = cur.fetchone()
            return None if row is None else self._with_nodes(cur, row)

    def workflow_get(self, conn: SyncConn, workflow_id: int) -> Workflow | None:
        with translate(), conn.cursor(row_factory=dict_row) as cur:
            cur.execute(QUERIES["workflow_get"], {"id": workflow_id})
            row = cur.fetchone()
            return None if row is None else self._with_nodes(cur, row)

    def workflow_get_by_idempotency_key(self, conn: SyncConn, key: str) -> Workflow | None:
        with translate(), conn.cursor(row_factory=dict_row) as cur:
            cur.execute(QUERIES["workflow_get_by_idempotency_key"], {"idempotency_key": key})
            row = cur.fetchone()
            return None if row is None else self._with_nodes(cur, row)

    @staticmethod
    def _with_nodes(cur: psycopg.Cursor[DictRow], row: DictRow) -> Workflow:
        cur.execute(QUERIES["workflow_nodes"], {"id": row["id"]})
        return Workflow.from_rows(row, [Job.from_row(r) for r in cur.fetchall()])

    def job_get_by_idempotency_key(self, conn: SyncConn, key: str) -> Job | None:
        with translate(), conn.cursor(row_factory=dict_row) as cur:
            cur.execute(QUERIES["job_get_by_idempotency_key"], {"idempotency_key": key})
            row = cur.fetchone()
            return Job.from_row(row) if row else None

    def job_get(self, conn: SyncConn, job_id: int) -> Job | None:
        with translate(), conn.cursor(row_factory=dict_row) as cur:
            cur.execute(QUERIES["job_get"], {"id": job_id})
            row = cur.fetchone()
            return Job.from_row(row) if row else None

    def job_insert_many(
        self, conn: SyncConn, jobs: Sequence[NewJob], default_max_attempts: int
    ) -> list[int]:
        """COPY the jobs into a staging table, then move them in one INSERT.

        Must run inside a transaction (the staging table empties at commit). A batch
        in which some job has ``depends_on`` is inserted one job at a time instead
        (job_insert with its dependency locks), in the same transaction.
        """
        if batch_dependencies(jobs):
            inserted = [self._job_insert_with_deps(conn, j, default_max_attempts) for j in jobs]
            return [j.id for j in inserted if j is not None]
        with translate(), conn.cursor() as cur:
            cur.execute(QUERIES["job_stage_prepare"])
            cur.execute(QUERIES["job_stage_clear"])
            # jsonb columns as JSON text (text-format COPY): the backoff's text is made
            # once per policy rather than once per row
            with cur.copy(QUERIES["job_stage_copy"]) as copy:
                for i, job in enumerate(jobs):
                    copy.write_row(
                        (
                            i,
                            job.type,
                            job.queue,
                            job.priority,
                            json.dumps(job.payload),
                            job.max_attempts or default_max_attempts,
                            job.backoff.json_text,
                            job.timeout_ms,
                            job.run_at,
                            job.delay_ms,
                            job.idempotency_key,
                            job.request_hash() if job.idempotency_key else None,
                            job.start_by,
                            job.deadline,
                            job.heartbeat_timeout_ms,
                            job.limit_key,
                        )
                    )
            cur.execute(QUERIES["job_insert_staged"])
            return [int(r[0]) for r in cur.fetchall()]

    def job_finish_in(
        self, conn: SyncConn, finishes: Sequence[Finish], idle_ms: int = FINISH_IDLE_MS
    ) -> set[int]:
        """See AsyncStore.job_finish_in."""
        # tuple rows whatever the connection's row factory
        with translate(), conn.cursor(row_factory=tuple_row) as cur:
            cur.execute(QUERIES["tx_idle_limit"], {"idle_ms": idle_ms})
            cur.execute(QUERIES["job_finish_many"], finish_params(finishes))
            return {int(r[0]) for r in cur.fetchall()}

    def effect_insert(self, conn: SyncConn, job_id: int, lease_token: int) -> None:
        with translate():
            conn.execute(QUERIES["effect_insert"], {"job_id": job_id, "lease_token": lease_token})

    # -- limits (see deadman.store.limits) -------------------------------------------

    def _rows(self, conn: SyncConn, name: LiteralString, params: dict[str, Any]) -> list[DictRow]:
        with translate(), conn.cursor(row_factory=dict_row) as cur:
            cur.execute(QUERIES[name], params)
            return cur.fetchall() if cur.description else []

    def limit_put(self, conn: SyncConn, p: LimitParams) -> Limit:
        return limits_of(self._rows(conn, "limit_put", limit_params(p)))[0]

    def limit_list(self, conn: SyncConn) -> list[Limit]:
        return limits_of(self._rows(conn, "limit_list", list_params()))

    def limit_get(self, conn: SyncConn, key: str) -> Limit | None:
        found = limits_of(self._rows(conn, "limit_get", {"key": key}))
        return found[0] if found else None

    def limit_delete(self, conn: SyncConn, key: str) -> bool:
        return bool(self._rows(conn, "limit_delete", {"key": key}))


def is_transient(exc: BaseException) -> bool:
    return isinstance(exc, DatabaseUnavailable)
