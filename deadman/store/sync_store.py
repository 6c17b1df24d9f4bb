"""Sync access on a connection the caller owns (sync handlers' ctx.transaction(),
tests): an insert joins the caller's own transaction. Each method runs the plan
AsyncStore runs too (deadman.store.plans), with the sync runner."""

from __future__ import annotations

from collections.abc import Sequence

from deadman.db.queries import QUERIES
from deadman.errors import DatabaseUnavailable, translate
from deadman.model import Job, Workflow
from deadman.store import plans
from deadman.store.conn import SyncConn
from deadman.store.jobs import NewJob
from deadman.store.leases import FINISH_IDLE_MS, Finish, succeed_params
from deadman.store.limits import Limit, LimitParams
from deadman.store.plan import run_sync
from deadman.store.plans import workflow_of
from deadman.store.workflows import NewWorkflow


class SyncStore:
    """Sync access on a connection the caller owns (and whose transaction it controls)."""

    def job_insert(self, conn: SyncConn, job: NewJob, default_max_attempts: int) -> Job | None:
        """With depends_on, needs a transaction (the caller's, else one of its own)."""
        return run_sync(conn, plans.job_insert(job, default_max_attempts))

    def workflow_insert(
        self, conn: SyncConn, wf: NewWorkflow, default_max_attempts: int
    ) -> Workflow | None:
        """As AsyncStore.workflow_insert, on the caller's connection (and transaction)."""
        return workflow_of(run_sync(conn, plans.workflow_insert(wf, default_max_attempts)))

    def workflow_get(self, conn: SyncConn, workflow_id: int) -> Workflow | None:
        return workflow_of(run_sync(conn, plans.workflow_get(workflow_id)))

    def workflow_get_by_idempotency_key(self, conn: SyncConn, key: str) -> Workflow | None:
        return workflow_of(run_sync(conn, plans.workflow_get_by_idempotency_key(key)))

    def job_get_by_idempotency_key(self, conn: SyncConn, key: str) -> Job | None:
        return run_sync(conn, plans.job_get_by_idempotency_key(key))

    def job_get(self, conn: SyncConn, job_id: int) -> Job | None:
        return run_sync(conn, plans.job_get(job_id))

    def job_insert_many(
        self, conn: SyncConn, jobs: Sequence[NewJob], default_max_attempts: int
    ) -> list[int]:
        """See :func:`deadman.store.plans.job_insert_many`."""
        return run_sync(conn, plans.job_insert_many(jobs, default_max_attempts))

    def job_succeed_in(self, conn: SyncConn, finish: Finish, idle_ms: int = FINISH_IDLE_MS) -> bool:
        """See AsyncStore.job_succeed_in."""
        with translate():
            cur = conn.execute(QUERIES["job_succeed_in"], succeed_params(finish, idle_ms))
            return cur.rowcount == 1

    def effect_insert(self, conn: SyncConn, job_id: int, lease_token: int) -> None:
        with translate():
            conn.execute(QUERIES["effect_insert"], {"job_id": job_id, "lease_token": lease_token})

    # -- limits (see deadman.store.limits) -------------------------------------------

    def limit_put(self, conn: SyncConn, p: LimitParams) -> Limit:
        return run_sync(conn, plans.limit_put(p))

    def limit_list(self, conn: SyncConn) -> list[Limit]:
        return run_sync(conn, plans.limit_list())

    def limit_get(self, conn: SyncConn, key: str) -> Limit | None:
        return run_sync(conn, plans.limit_get(key))

    def limit_delete(self, conn: SyncConn, key: str) -> bool:
        return run_sync(conn, plans.limit_delete(key))


def is_transient(exc: BaseException) -> bool:
    return isinstance(exc, DatabaseUnavailable)
