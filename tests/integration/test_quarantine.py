"""job_quarantine_pending must say "yes" exactly when job_claim_quarantined can take a
job: the producer drains its slots whenever it is told a suspect waits, so a "yes" the
claim can never honour throttles every worker of the queue (a poison pill in a paused
queue did: 422 -> 107 short jobs in 15 s), and a "no" while one waits starves it."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from psycopg.rows import DictRow

from deadman.db.queries import QUERIES
from deadman.store import ClaimParams, claim_params
from tests.factories import connect, insert_job

QUARANTINE_AT = 5


def _pending(conn: psycopg.Connection[DictRow]) -> bool:
    row = conn.execute(
        QUERIES["job_quarantine_pending"], {"queues": ["q"], "quarantine_at": QUARANTINE_AT}
    ).fetchone()
    assert row is not None
    return bool(row["pending"])


def _claimable(conn: psycopg.Connection[DictRow]) -> bool:
    with conn.transaction(force_rollback=True):
        p = ClaimParams("q", "w", 1, 30_000, QUARANTINE_AT)
        return bool(conn.execute(QUERIES["job_claim_quarantined"], claim_params(p)).fetchall())


CASES: dict[str, tuple[dict[str, Any], str | None]] = {
    "due": ({}, None),
    "paused queue": ({}, "INSERT INTO deadman.queues (name, paused) VALUES ('q', true)"),
    "start_by passed": ({}, "UPDATE deadman.jobs SET start_by = now() - interval '1 s'"),
    "deadline passed": ({}, "UPDATE deadman.jobs SET deadline = now() - interval '1 s'"),
    "start_by ahead": ({}, "UPDATE deadman.jobs SET start_by = now() + interval '1 h'"),
    "not due yet": ({"state": "scheduled", "run_in_s": 60}, None),
    "rescued less": ({"rescues": QUARANTINE_AT - 1}, None),
    "running": ({"state": "running"}, None),
    "other queue paused": ({}, "INSERT INTO deadman.queues (name, paused) VALUES ('r', true)"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_pending_means_the_quarantine_claim_can_take_it(db_dsn: str, case: str) -> None:
    job, extra = CASES[case]
    with connect(db_dsn) as conn:
        kw: dict[str, Any] = {"state": "queued", "run_in_s": -1, "rescues": QUARANTINE_AT}
        kw.update(job)
        insert_job(conn, queue="q", **kw)
        if extra:
            conn.execute(extra)
        assert _pending(conn) == _claimable(conn), case


def test_a_suspect_in_a_paused_queue_is_not_pending(db_dsn: str) -> None:
    with connect(db_dsn) as conn:
        insert_job(conn, queue="q", run_in_s=-1, rescues=QUARANTINE_AT)
        assert _pending(conn)
        conn.execute("INSERT INTO deadman.queues (name, paused) VALUES ('q', true)")
        assert not _pending(conn)
