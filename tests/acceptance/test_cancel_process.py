"""Cancelling running jobs in real worker processes: a cancel racing the claim is
never lost (many iterations), and a running handler hears it by NOTIFY."""

from __future__ import annotations

import psycopg
import pytest
from psycopg.rows import dict_row

from deadman.client import Client
from deadman.db.queries import QUERIES
from tests.helpers.processes import (
    STEADY_TTL_S,
    SpawnWorker,
    attempts_of,
    states_of,
    wait_all_state,
    wait_registered,
)

pytestmark = pytest.mark.slow


def test_a_cancel_racing_the_claim_is_never_lost(db_dsn: str, spawn_worker: SpawnWorker) -> None:
    """Two idle listening workers claim each job within milliseconds of its insert
    (NOTIFY); the cancel is sent right after the insert, so it lands before, during
    or after the claim. Whatever the order, every job ends cancelled: never running
    on, never succeeded."""
    workers = [
        spawn_worker(db_dsn, concurrency=8, DEADMAN_LEASE_TTL_S=STEADY_TTL_S) for _ in range(2)
    ]
    for w in workers:
        wait_registered(db_dsn, w.pid)
    ids: list[int] = []
    seen = {"queued": 0, "running": 0}
    with (
        Client(db_dsn) as client,
        psycopg.connect(db_dsn, autocommit=True, row_factory=dict_row) as conn,
    ):
        for _ in range(80):
            job = client.enqueue("sleep", {"ms": 60_000})
            row = conn.execute(QUERIES["job_cancel"], {"id": job.id}).fetchone()
            assert row is not None, "a job that cannot have finished was refused a cancel"
            seen["running" if row["state"] == "running" else "queued"] += 1
            ids.append(job.id)
    wait_all_state(db_dsn, ids, "cancelled", timeout=30)
    assert states_of(db_dsn, ids) == {"cancelled": len(ids)}
    for job_id in ids:
        outcomes = [a["outcome"] for a in attempts_of(db_dsn, job_id)]
        assert outcomes in ([], ["cancelled"]), (job_id, outcomes)
    # report which side of the race each cancel landed on (both happen on a quiet box)
    print(f"cancel landed on: {seen}")
