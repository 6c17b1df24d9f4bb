"""Workflows built and driven by hand: the diamond graph, a connection that logs every
finalisation (``conn``, a fixture: import it by name), jobs claimed and finished as a
worker would, through the real completion query."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg.rows import DictRow

from deadman.db.queries import QUERIES
from deadman.model import AttemptOutcome, JobState
from deadman.store import Finish, finish_params
from tests.factories import connect
from tests.helpers.api import api_client

DIAMOND: dict[str, Any] = {
    "name": "diamond",
    "nodes": [
        {"name": "a", "type": "noop"},
        {"name": "b", "type": "noop", "payload": {"n": 1}},
        {"name": "c", "type": "noop", "queue": "other"},
        {"name": "d", "type": "noop"},
    ],
    "edges": [
        {"from": "a", "to": "b"},
        {"from": "a", "to": "c"},
        {"from": "b", "to": "d"},
        {"from": "c", "to": "d"},
    ],
}


@pytest.fixture
def conn(db_dsn: str) -> Iterator[psycopg.Connection[DictRow]]:
    with connect(db_dsn) as c:
        c.execute(
            """
            CREATE TABLE public.wf_final (workflow_id bigint, state text);
            CREATE FUNCTION public.log_final() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                INSERT INTO public.wf_final VALUES (NEW.id, NEW.state);
                RETURN NULL;
            END $$;
            CREATE TRIGGER log_final AFTER UPDATE ON deadman.workflows FOR EACH ROW
                WHEN (OLD.state = 'running' AND NEW.state <> 'running')
                EXECUTE FUNCTION public.log_final();
            """
        )
        yield c


def finals(conn: psycopg.Connection[DictRow], workflow_id: int) -> list[str]:
    rows = conn.execute(
        "SELECT state FROM public.wf_final WHERE workflow_id = %s", (workflow_id,)
    ).fetchall()
    return [r["state"] for r in rows]


def nodes(conn: psycopg.Connection[DictRow], workflow_id: int) -> dict[str, DictRow]:
    rows = conn.execute(
        "SELECT * FROM deadman.jobs WHERE workflow_id = %s ORDER BY id", (workflow_id,)
    ).fetchall()
    return {r["node"]: r for r in rows}


def workflow(conn: psycopg.Connection[DictRow], workflow_id: int) -> DictRow:
    row = conn.execute("SELECT * FROM deadman.workflows WHERE id = %s", (workflow_id,)).fetchone()
    assert row is not None
    return row


def claim(conn: psycopg.Connection[Any], job_id: int) -> int:
    """Put a due job into 'running' as a claim would; returns its fencing token."""
    row = conn.execute(
        "UPDATE deadman.jobs SET state = 'running', attempt = attempt + 1,"
        " lease_token = nextval('deadman.lease_token_seq'), lease_worker = 'test',"
        " lease_expires_at = now() + interval '30 seconds', started_at = now()"
        " WHERE id = %s AND state IN ('queued', 'scheduled', 'retrying') RETURNING lease_token",
        (job_id,),
    ).fetchone()
    assert row is not None, f"job {job_id} is not claimable"
    return int(row["lease_token"] if isinstance(row, dict) else row[0])


def finish(conn: psycopg.Connection[Any], job_id: int, token: int, state: JobState) -> None:
    """End the attempt through the real completion query (job_finish_many)."""
    outcome = AttemptOutcome.SUCCEEDED if state is JobState.SUCCEEDED else AttemptOutcome.FAILED
    rows = conn.execute(
        QUERIES["job_finish_many"], finish_params([Finish(job_id, token, state, outcome)])
    ).fetchall()
    assert [r["id"] if isinstance(r, dict) else r[0] for r in rows] == [job_id]


def run(conn: psycopg.Connection[Any], job_id: int, state: JobState = JobState.SUCCEEDED) -> None:
    finish(conn, job_id, claim(conn, job_id), state)


def create(dsn: str, body: dict[str, Any]) -> int:
    with api_client(dsn) as c:
        r = c.post("/workflows", json=body)
        assert r.status_code == 201, r.text
        return int(r.json()["id"])


def lock_waiters(conn: psycopg.Connection[DictRow]) -> bool:
    row = conn.execute(
        "SELECT count(*) AS n FROM pg_stat_activity"
        " WHERE datname = current_database() AND wait_event_type = 'Lock'"
    ).fetchone()
    return bool(row and row["n"] > 0)
