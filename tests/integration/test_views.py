"""The SQL inspection views of migration 0004 and the read-only role."""

from __future__ import annotations

import psycopg
import pytest
from psycopg import errors as pgerr

from tests.factories import connect, insert_job


def test_queue_summary_counts_pending_work_per_queue(db_dsn: str) -> None:
    with connect(db_dsn) as conn:
        insert_job(conn, state="queued", queue="mail", run_in_s=-30)
        insert_job(conn, state="queued", queue="mail", run_in_s=-5)
        insert_job(conn, state="scheduled", queue="mail", run_in_s=60)
        insert_job(conn, state="running", queue="mail")
        insert_job(conn, state="succeeded", queue="mail")  # not pending: not counted
        insert_job(conn, state="queued", queue="etl")
        conn.execute("INSERT INTO deadman.queues (name, paused) VALUES ('idle', true)")
        rows = {r["queue"]: r for r in conn.execute("SELECT * FROM deadman.queue_summary")}
    assert set(rows) == {"mail", "etl", "idle"}
    mail = rows["mail"]
    assert (mail["due"], mail["later"], mail["running"], mail["paused"]) == (2, 1, 1, False)
    assert 29 <= mail["oldest_due_age"].total_seconds() < 60
    assert rows["idle"]["paused"] is True and rows["idle"]["due"] == 0
    assert rows["idle"]["oldest_due_age"] is None


def test_running_and_stuck_jobs(db_dsn: str) -> None:
    with connect(db_dsn) as conn:
        fine = insert_job(conn, state="running", lease_expires_in_s=20).id
        stuck = insert_job(conn, state="running", lease_expires_in_s=-15).id
        insert_job(conn, state="queued")
        running = {r["id"]: r for r in conn.execute("SELECT * FROM deadman.running_jobs")}
        stuck_rows = conn.execute("SELECT * FROM deadman.stuck_jobs").fetchall()
    assert set(running) == {fine, stuck}
    assert running[fine]["lease_left"].total_seconds() > 0
    assert running[fine]["lease_token"] is not None
    # both sides of the threshold: only the lapsed lease is stuck
    assert [r["id"] for r in stuck_rows] == [stuck]
    assert 14 <= stuck_rows[0]["expired_for"].total_seconds() < 60


def test_dead_letters_and_recent_throughput(db_dsn: str) -> None:
    with connect(db_dsn) as conn:
        dead = insert_job(conn, state="dead", last_error="card declined").id
        insert_job(conn, state="succeeded", finished_ago_s=30)
        insert_job(conn, state="succeeded", finished_ago_s=30)
        insert_job(conn, state="succeeded", finished_ago_s=2 * 3600)  # outside the hour
        letters = conn.execute("SELECT id, last_error FROM deadman.dead_letters").fetchall()
        per_state = {
            r["state"]: r["n"]
            for r in conn.execute(
                "SELECT state, sum(jobs)::int AS n FROM deadman.recent_throughput GROUP BY state"
            )
        }
    assert [(r["id"], r["last_error"]) for r in letters] == [(dead, "card declined")]
    assert per_state == {"succeeded": 2, "dead": 1}


def test_the_reader_role_reads_views_and_nothing_else(db_dsn: str) -> None:
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        insert_job(conn, state="dead")
        conn.execute("SET ROLE deadman_reader")
        for view in (
            "queue_summary",
            "running_jobs",
            "stuck_jobs",
            "dead_letters",
            "recent_throughput",
        ):
            conn.execute(f"SELECT * FROM deadman.{view}").fetchall()
        for statement in (
            "SELECT * FROM deadman.jobs",
            "SELECT * FROM deadman.attempts",
            "UPDATE deadman.jobs SET priority = 1",
            "DELETE FROM deadman.jobs",
            "DROP VIEW deadman.dead_letters",
        ):
            with pytest.raises(pgerr.InsufficientPrivilege):
                conn.execute(statement)
