"""Deadlines and cancelling running jobs, against a real database and a real Worker
in this process: start_by, deadline, timeout_ms (async and sync, with the late
write of an abandoned thread refused), heartbeat_timeout_ms, and cancel by NOTIFY.
Both sides of every threshold; no fixed sleeps."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from functools import partial

import psycopg
import pytest
from psycopg import sql
from psycopg.rows import DictRow

from deadman.client import Client
from deadman.db.queries import QUERIES
from deadman.maintenance import Expirer
from deadman.model import Job
from deadman.store import AsyncStore, ClaimParams, UnknownDependency
from deadman.worker.context import JobContext
from tests.factories import attempt_rows, connect, db_now, insert_job, job_row, with_store
from tests.helpers import wait_for
from tests.helpers.api import api_client, assert_problem, error_fields
from tests.helpers.worker import (
    SETTINGS,
    effects,
    registry,
    running_worker,
    state_of,
    wait_terminal,
)
from tests.helpers.workflows import run as run_job

release_thread = threading.Event()
seen_cancel = threading.Event()


@registry.handler("dl.sync-ignores-timeout")
def sync_ignores_timeout(job: Job, ctx: JobContext) -> None:
    # Ignores ctx.cancelled on purpose, then tries its fenced write late.
    release_thread.wait(timeout=20)
    with ctx.transaction() as conn:
        conn.execute(QUERIES["effect_insert"], {"job_id": job.id, "lease_token": ctx.lease_token})


@registry.handler("dl.sync-until-cancelled")
def sync_until_cancelled(job: Job, ctx: JobContext) -> None:
    if ctx.wait_cancelled(timeout=20):
        seen_cancel.set()


@registry.handler("dl.beats")
async def beats(job: Job, ctx: JobContext) -> str:
    """Beat every 50 ms for ``beat_ms``, then (``hang``) stop beating and wait."""
    payload = job.payload or {}
    until = time.monotonic() + payload["beat_ms"] / 1000
    while time.monotonic() < until:
        ctx.heartbeat()
        await asyncio.sleep(0.05)
    if payload.get("hang"):
        await asyncio.sleep(30)
    return "done"


@pytest.fixture
def client(db_dsn: str) -> Iterator[Client]:
    with Client(db_dsn, settings=SETTINGS) as c:
        yield c


@pytest.fixture
def conn(db_dsn: str) -> Iterator[psycopg.Connection[DictRow]]:
    with connect(db_dsn) as c:
        yield c


def _claim(dsn: str, queue: str = "default") -> list[int]:
    jobs = with_store(
        dsn, lambda s: s.job_claim(ClaimParams(queue=queue, worker="w", limit=10, ttl_ms=30_000))
    )
    return [j.id for j in jobs]


async def _retry(store: AsyncStore, job_id: int) -> Job | None:
    return await store.job_retry(job_id)


def _tick(dsn: str) -> None:
    with_store(dsn, lambda s: Expirer(s, SETTINGS).tick())


# --------------------------------------------------------------------------- start_by


def test_start_by_passed_ends_dead_expired_without_running(
    db_dsn: str, conn: psycopg.Connection[DictRow], client: Client
) -> None:
    now = db_now(conn)
    late = client.enqueue("noop", start_by=now - timedelta(seconds=1))
    on_time = client.enqueue("noop", start_by=now + timedelta(hours=1))
    assert late.start_by is not None and late.state.value == "queued"
    assert _claim(db_dsn) == [on_time.id]  # the claim passes over the expired one
    _tick(db_dsn)
    row = job_row(conn, late.id)
    assert (row["state"], row["last_error"], row["attempt"]) == ("dead", "expired", 0)
    assert attempt_rows(conn, late.id) == []
    assert job_row(conn, on_time.id)["state"] == "running"


def test_retrying_an_expired_job_runs_it_and_keeps_a_start_by_still_ahead(
    db_dsn: str, conn: psycopg.Connection[DictRow], client: Client
) -> None:
    now = db_now(conn)
    expired = client.enqueue("noop", start_by=now - timedelta(seconds=1))
    late = client.enqueue("noop", deadline=now - timedelta(seconds=1))
    _tick(db_dsn)
    assert [job_row(conn, j.id)["last_error"] for j in (expired, late)] == ["expired", "deadline"]
    conn.execute(
        "UPDATE deadman.jobs SET state = 'dead', finished_at = now(),"
        " start_by = now() + interval '1 hour' WHERE id = %s",
        (on_time := client.enqueue("noop").id,),
    )
    for job_id in (expired.id, late.id, on_time):
        assert with_store(db_dsn, partial(_retry, job_id=job_id)) is not None
    rows = {j: job_row(conn, j) for j in (expired.id, late.id, on_time)}
    assert rows[expired.id]["start_by"] is None and rows[late.id]["deadline"] is None
    assert rows[on_time]["start_by"] is not None  # still ahead: kept
    _tick(db_dsn)  # the rescuer's look no longer ends them
    assert {r["state"] for r in (job_row(conn, j) for j in rows)} == {"queued"}
    assert sorted(_claim(db_dsn)) == sorted(rows)


# --------------------------------------------------------------------------- deadline


def test_no_attempt_starts_after_the_deadline(
    db_dsn: str, conn: psycopg.Connection[DictRow]
) -> None:
    past = insert_job(conn, state="retrying", run_in_s=-1)
    future = insert_job(conn, state="retrying", run_in_s=-1)
    conn.execute(
        "UPDATE deadman.jobs SET deadline = now() - interval '1 second' WHERE id = %s", (past.id,)
    )
    conn.execute(
        "UPDATE deadman.jobs SET deadline = now() + interval '1 hour' WHERE id = %s", (future.id,)
    )
    assert _claim(db_dsn) == [future.id]
    _tick(db_dsn)
    row = job_row(conn, past.id)
    assert (row["state"], row["last_error"]) == ("dead", "deadline")
    assert row["finished_at"] is not None


def test_deadline_through_the_api(db_dsn: str, conn: psycopg.Connection[DictRow]) -> None:
    with api_client(db_dsn) as c:
        r = c.post(
            "/jobs",
            json={
                "type": "noop",
                "deadline": "2000-01-01T00:00:00Z",
                "start_by": "2999-01-01T00:00:00Z",
                "heartbeat_timeout_ms": 500,
            },
        )
        assert r.status_code == 201, r.text
        job = r.json()
        assert job["deadline"] == "2000-01-01T00:00:00.000000Z"
        assert job["start_by"] == "2999-01-01T00:00:00.000000Z"
        assert job["heartbeat_timeout_ms"] == 500
        bad = c.post("/jobs", json={"type": "noop", "deadline": "soon"})
        assert_problem(bad, 422)
    _tick(db_dsn)
    assert job_row(conn, int(job["id"]))["last_error"] == "deadline"


# --------------------------------------------------------------------------- timeout_ms


def test_an_async_timeout_retries_then_dies(db_dsn: str, client: Client) -> None:
    job_id = client.enqueue("sleep", {"ms": 30_000}, timeout=0.2, max_attempts=2).id
    fast = replace(SETTINGS, max_attempts=2)
    with connect(db_dsn) as conn, running_worker(db_dsn, fast):
        conn.execute(
            'UPDATE deadman.jobs SET backoff = \'{"base_ms": 0, "jitter": "none"}\' WHERE id = %s',
            (job_id,),
        )
        wait_terminal(conn, [job_id], timeout=10)
        assert state_of(conn, job_id) == "dead"
        outcomes = [a["outcome"] for a in attempt_rows(conn, job_id)]
        assert outcomes == ["timed_out", "timed_out"]


def test_a_late_write_from_a_timed_out_thread_is_refused(db_dsn: str, client: Client) -> None:
    release_thread.clear()
    job_id = client.enqueue("dl.sync-ignores-timeout", timeout=0.3, max_attempts=1).id
    with connect(db_dsn) as conn, running_worker(db_dsn) as worker:
        wait_terminal(conn, [job_id], timeout=5)
        row = job_row(conn, job_id)
        assert (row["state"], row["last_error"]) == ("dead", "timed out after 300 ms")
        release_thread.set()  # the thread now tries its fenced write

        def refused() -> bool:
            r = conn.execute(
                "SELECT count(*) AS n FROM deadman.lease_refusals"
                " WHERE job_id = %s AND action = 'transaction'",
                (job_id,),
            ).fetchone()
            return bool(r and r["n"] == 1)

        wait_for(refused, timeout=5, message="the late write to be refused")
        assert worker.stop() == 0
    with connect(db_dsn) as conn:
        assert effects(conn, job_id) == 0
        assert [a["outcome"] for a in attempt_rows(conn, job_id)] == ["timed_out"]


# ------------------------------------------------------------------- heartbeat timeout


def test_a_handler_that_stops_beating_is_treated_as_hung(db_dsn: str, client: Client) -> None:
    hung = client.enqueue(
        "dl.beats", {"beat_ms": 400, "hang": True}, heartbeat_timeout=0.3, max_attempts=1
    ).id
    # the other side: beats for longer than the timeout, and finishes
    alive = client.enqueue("dl.beats", {"beat_ms": 800}, heartbeat_timeout=0.3).id
    with connect(db_dsn) as conn, running_worker(db_dsn):
        wait_terminal(conn, [hung, alive], timeout=10)
        row = job_row(conn, hung)
        assert row["state"] == "dead"
        assert row["last_error"] == "no heartbeat for 300 ms: treated as hung"
        assert [a["outcome"] for a in attempt_rows(conn, hung)] == ["timed_out"]
        assert state_of(conn, alive) == "succeeded"


# --------------------------------------------------------------------------- cancel


SLOW_BEATS = replace(SETTINGS, lease_ttl_s=60.0, heartbeat_s=20.0, poll_s=0.2)
#: A cancel seen this soon came by NOTIFY (the next heartbeat is 20 s away), with room
#: for a stall of the loaded test machine.
BY_NOTIFY_S = 8.0


def test_cancel_reaches_an_async_handler_by_notify_not_heartbeat(
    db_dsn: str, client: Client
) -> None:
    """Heartbeats every 20 s: the cancel arriving within a few seconds proves NOTIFY."""
    job_id = client.enqueue("sleep", {"ms": 60_000}).id
    with connect(db_dsn) as conn, running_worker(db_dsn, SLOW_BEATS) as worker:
        wait_for(lambda: state_of(conn, job_id) == "running", timeout=5, message="running")
        with api_client(db_dsn) as c:
            r = c.post(f"/jobs/{job_id}/cancel")
            assert r.status_code == 202, r.text
            wait_for(lambda: state_of(conn, job_id) == "cancelled", BY_NOTIFY_S, message="cancel")
            assert [a["outcome"] for a in attempt_rows(conn, job_id)] == ["cancelled"]
            assert_problem(c.post(f"/jobs/{job_id}/cancel"), 409)
        assert worker.stop() == 0


def test_a_sync_handler_sees_ctx_cancelled(db_dsn: str, client: Client) -> None:
    seen_cancel.clear()
    job_id = client.enqueue("dl.sync-until-cancelled").id
    with connect(db_dsn) as conn, running_worker(db_dsn, SLOW_BEATS) as worker:
        wait_for(lambda: state_of(conn, job_id) == "running", timeout=5, message="running")
        with api_client(db_dsn) as c:
            assert c.post(f"/jobs/{job_id}/cancel").status_code == 202
        wait_for(lambda: state_of(conn, job_id) == "cancelled", BY_NOTIFY_S, message="cancel")
        assert seen_cancel.wait(timeout=BY_NOTIFY_S)
        row = job_row(conn, job_id)
        assert row["last_error"] == "cancelled on request"
        assert [a["outcome"] for a in attempt_rows(conn, job_id)] == ["cancelled"]
        assert worker.stop() == 0


def test_a_handler_that_finished_first_stays_succeeded_and_the_cancel_is_409(
    db_dsn: str, client: Client
) -> None:
    job_id = client.enqueue("noop").id
    with connect(db_dsn) as conn, running_worker(db_dsn):
        wait_terminal(conn, [job_id], timeout=5)
        with api_client(db_dsn) as c:
            assert_problem(c.post(f"/jobs/{job_id}/cancel"), 409)
        row = job_row(conn, job_id)
        assert (row["state"], row["cancel_requested"]) == ("succeeded", False)


def _upstream(conn: psycopg.Connection[DictRow], client: Client) -> tuple[Job, Job]:
    """Two jobs to depend on: one queued, one dead."""
    a = client.enqueue("noop")
    dead = client.enqueue("noop")
    conn.execute(
        "UPDATE deadman.jobs SET state = 'dead', finished_at = now() WHERE id = %s", (dead.id,)
    )
    return a, dead


def _count(conn: psycopg.Connection[DictRow], table: str) -> int:
    query = sql.SQL("SELECT count(*) AS n FROM deadman.{}").format(sql.Identifier(table))
    row = conn.execute(query).fetchone()
    assert row is not None
    return int(row["n"])


def test_enqueue_many_carries_deadlines_and_dependencies(
    conn: psycopg.Connection[DictRow], client: Client
) -> None:
    """Client.enqueue_many (COPY, or one insert per job when some job has depends_on)
    keeps start_by, deadline, heartbeat_timeout and depends_on."""
    later = datetime(2999, 1, 1, tzinfo=UTC)
    ids = client.enqueue_many(
        [client.job("noop", start_by=later, deadline=later, heartbeat_timeout=1.5)]
    )
    row = job_row(conn, ids[0])
    assert (row["start_by"], row["deadline"], row["heartbeat_timeout_ms"]) == (later, later, 1500)
    a, dead = _upstream(conn, client)
    w1, w2 = client.enqueue_many(
        [client.job("noop", depends_on=[a]), client.job("noop", depends_on=[a, dead])]
    )
    assert (job_row(conn, w1)["state"], job_row(conn, w1)["pending_deps"]) == ("waiting", 1)
    assert (job_row(conn, w2)["state"], job_row(conn, w2)["last_error"]) == (
        "cancelled",
        f"upstream job {dead.id} dead",
    )
    assert _count(conn, "job_deps") == 3
    with pytest.raises(UnknownDependency):
        client.enqueue_many([client.job("noop"), client.job("noop", depends_on=[987654])])
    # the dependency succeeds: the waiting job is released
    run_job(conn, a.id)
    assert job_row(conn, w1)["state"] == "queued"


def test_post_jobs_batch_carries_deadlines_and_dependencies(
    db_dsn: str, conn: psycopg.Connection[DictRow], client: Client
) -> None:
    a, dead = _upstream(conn, client)
    before = _count(conn, "jobs")
    batch = {
        "jobs": [
            {"type": "noop", "deadline": "2999-01-01T00:00:00Z", "idempotency_key": "b1"},
            {"type": "noop", "depends_on": [str(a.id)], "idempotency_key": "b2"},
            {"type": "noop", "depends_on": [str(dead.id)]},
        ]
    }
    with api_client(db_dsn) as c:
        r = c.post("/jobs/batch", json=batch)
        assert r.status_code == 201, r.text
        got = r.json()["jobs"]
        assert [j["state"] for j in got] == ["queued", "waiting", "cancelled"]
        assert got[0]["deadline"] == "2999-01-01T00:00:00.000000Z"
        edges = conn.execute(
            "SELECT job_id, depends_on FROM deadman.job_deps WHERE job_id = ANY(%s)",
            ([int(j["id"]) for j in got],),
        ).fetchall()
        assert {(e["job_id"], e["depends_on"]) for e in edges} == {
            (int(got[1]["id"]), a.id),
            (int(got[2]["id"]), dead.id),
        }
        # a replay of the keyed part adds no edge and no job
        r = c.post("/jobs/batch", json={"jobs": batch["jobs"][:2]})
        assert r.status_code == 200 and r.headers["idempotent-replayed"] == "true"
        bad = c.post(
            "/jobs/batch",
            json={"jobs": [{"type": "noop"}, {"type": "noop", "depends_on": ["987654"]}]},
        )
        assert_problem(bad, 422)
        assert error_fields(bad) == {"jobs[1].depends_on"}
    assert _count(conn, "jobs") == before + 3
    assert _count(conn, "job_deps") == 2
    # the dependency succeeds: the batch's waiting job is released
    run_job(conn, a.id)
    assert job_row(conn, int(got[1]["id"]))["state"] == "queued"
