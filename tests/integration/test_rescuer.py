"""The rescuer: expired leases, poison pills, cancels, leadership, retention, and its
race with a completing worker (interleaved deterministically on two connections)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
from psycopg.rows import DictRow

from deadman.config import Settings
from deadman.db.queries import QUERIES
from deadman.errors import DatabaseUnavailable, translate
from deadman.maintenance import Cleaner, CleanReport, Rescuer, RescueReport
from deadman.model import AttemptOutcome, JobState
from deadman.store import Finish, RescueParams, SyncStore, finish_params
from tests.factories import (
    async_store,
    attempt_rows,
    connect,
    insert_job,
    job_row,
    run_async,
    with_store,
)
from tests.helpers import wait_for
from tests.helpers.api import api_client

HOUR = 3600.0
DAY = 24 * HOUR


def tick(dsn: str, settings: Settings | None = None) -> RescueReport:
    """One tick of a fresh rescuer."""

    async def main() -> RescueReport:
        async with async_store(dsn) as store:
            return await Rescuer(store, settings or Settings()).tick()

    return run_async(main)


def clean(dsn: str, settings: Settings | None = None) -> CleanReport:
    """One tick of a fresh cleaner."""

    async def main() -> CleanReport:
        async with async_store(dsn) as store:
            return await Cleaner(store, settings or Settings()).tick()

    return run_async(main)


# ---------------------------------------------------------------------- expiry


def test_an_expired_lease_is_rescued(db_dsn: str) -> None:
    with connect(db_dsn) as conn:
        job = insert_job(
            conn, state="running", attempt=2, lease_expires_in_s=-10, lease_worker="gone"
        )
        report = tick(db_dsn)
        row = job_row(conn, job.id)
        (attempt,) = attempt_rows(conn, job.id)
    assert report.leader and report.requeued == [job.id]
    assert report.dead == [] and report.cancelled == []
    assert row["state"] == "queued"
    assert (row["rescues"], row["attempt"]) == (1, 1)  # an attempt given back
    assert row["lease_token"] is None and row["lease_expires_at"] is None
    assert row["finished_at"] is None
    assert attempt["outcome"] == "lease_expired"
    assert (attempt["lease_token"], attempt["attempt"]) == (job.lease_token, 2)
    assert attempt["worker"] == "gone"


def test_only_lapsed_leases_are_rescued(db_dsn: str) -> None:
    with connect(db_dsn) as conn:
        lapsed = insert_job(conn, state="running", lease_expires_in_s=-10).id
        alive = insert_job(conn, state="running", lease_expires_in_s=10).id
        report = tick(db_dsn)
        assert report.requeued == [lapsed]
        assert job_row(conn, alive)["state"] == "running"
        assert attempt_rows(conn, alive) == []


def test_a_rescued_job_wakes_its_queue(db_dsn: str) -> None:
    with connect(db_dsn) as conn, psycopg.connect(db_dsn, autocommit=True) as listener:
        listener.execute("LISTEN deadman_jobs")
        insert_job(conn, state="running", queue="mail", lease_expires_in_s=-10)
        tick(db_dsn)
        seen = wait_for(
            lambda: [n.payload for n in listener.notifies(timeout=0.2, stop_after=1)] or None,
            timeout=5,
            message="NOTIFY for the rescued job's queue",
        )
    assert seen == ["mail"]


def test_too_many_rescues_is_a_poison_pill(db_dsn: str) -> None:
    settings = Settings(max_rescues=2)
    with connect(db_dsn) as conn:
        # each on its own worker: a job is only blamed when it ran alone
        under = insert_job(
            conn, state="running", attempt=1, rescues=1, lease_expires_in_s=-10, lease_worker="a"
        ).id
        over = insert_job(
            conn, state="running", attempt=1, rescues=2, lease_expires_in_s=-10, lease_worker="b"
        ).id
        report = tick(db_dsn, settings)
        requeued, dead = job_row(conn, under), job_row(conn, over)
    assert report.requeued == [under] and report.dead == [over]
    assert (requeued["state"], requeued["rescues"], requeued["attempt"]) == ("queued", 2, 0)
    assert requeued["finished_at"] is None
    assert (dead["state"], dead["rescues"], dead["attempt"]) == ("dead", 3, 1)
    assert dead["finished_at"] is not None
    assert dead["last_error"] == (
        "lease expired 3 times, the last time while it ran alone (max_rescues 2): "
        "it keeps killing or stalling its worker"
    )


def test_a_job_is_not_blamed_for_a_crash_it_shared(db_dsn: str) -> None:
    # Two jobs over the limit on one crashed worker: neither can be blamed, both are
    # requeued (and quarantined: claimed only alone from now on).
    settings = Settings(max_rescues=2)
    with connect(db_dsn) as conn:
        a = insert_job(conn, state="running", attempt=1, rescues=2, lease_expires_in_s=-10).id
        b = insert_job(conn, state="running", attempt=1, rescues=2, lease_expires_in_s=-10).id
        report = tick(db_dsn, settings)
        rows = [job_row(conn, a), job_row(conn, b)]
    assert sorted(report.requeued) == sorted([a, b]) and report.dead == []
    assert [(r["state"], r["rescues"]) for r in rows] == [("queued", 3), ("queued", 3)]


def test_quarantined_jobs_are_claimed_only_alone(db_dsn: str) -> None:
    from deadman.store import AsyncStore, ClaimParams

    with connect(db_dsn) as conn:
        suspect = insert_job(conn, state="queued", rescues=2).id
        normal = insert_job(conn, state="queued").id

    async def claims() -> tuple[list[int], list[int]]:
        store = AsyncStore.create(db_dsn, min_size=1, max_size=2)
        await store.open()
        try:
            p = ClaimParams(queue="default", worker="w", limit=10, ttl_ms=5000, quarantine_at=2)
            batch = await store.job_claim(p)
            alone = await store.job_claim_quarantined(p)
            return [j.id for j in batch], [j.id for j in alone]
        finally:
            await store.close()

    batch, alone = asyncio.run(claims())
    assert batch == [normal]
    assert alone == [suspect]


def test_max_rescues_zero_kills_on_the_first_expiry(db_dsn: str) -> None:
    with connect(db_dsn) as conn:
        job_id = insert_job(conn, state="running", lease_expires_in_s=-1).id
        assert tick(db_dsn, Settings(max_rescues=0)).dead == [job_id]
        assert job_row(conn, job_id)["state"] == "dead"


def test_a_cancel_requested_job_ends_cancelled(db_dsn: str) -> None:
    with connect(db_dsn) as conn:
        job_id = insert_job(conn, state="running", cancel_requested=True, lease_expires_in_s=-10).id
        report = tick(db_dsn)
        row = job_row(conn, job_id)
        (attempt,) = attempt_rows(conn, job_id)
    assert report.cancelled == [job_id]
    assert row["state"] == "cancelled" and row["finished_at"] is not None
    assert row["last_error"] == "cancelled while its lease was lost"
    assert attempt["outcome"] == "lease_expired"


def test_the_rescue_works_in_batches(db_dsn: str) -> None:
    with connect(db_dsn) as conn:
        ids = [insert_job(conn, state="running", lease_expires_in_s=-5).id for _ in range(5)]

    def rescue(limit: int) -> list[int]:
        got = with_store(db_dsn, lambda s: s.job_rescue_expired(RescueParams(5, limit=limit)))
        assert got is not None
        return [r.id for r in got]

    first = rescue(3)
    assert first == ids[:3]  # oldest ids first
    assert rescue(3) == ids[3:]
    assert rescue(3) == []


# ------------------------------------------------------------------ leadership


def test_no_leadership_while_another_rescuer_holds_the_lock(db_dsn: str) -> None:
    with connect(db_dsn) as conn:
        job_id = insert_job(conn, state="running", lease_expires_in_s=-10).id
        with psycopg.connect(db_dsn) as leader:
            leader.execute("SELECT pg_advisory_xact_lock(716341, 2)")
            report = tick(db_dsn)
            assert report == RescueReport(leader=False)
            assert job_row(conn, job_id)["state"] == "running"
            leader.rollback()  # the transaction-level lock dies with the transaction
        report = tick(db_dsn)
        assert report.leader and report.requeued == [job_id]


def test_a_leader_paused_inside_its_tick_loses_leadership(db_dsn: str) -> None:
    """A leader that stops mid-tick (SIGSTOP, a partition) holds the advisory lock in
    an open transaction; the server ends that session after the idle limit, and the
    next rescuer leads again, instead of no job ever being rescued."""
    job_id, _ = _expired_running(db_dsn)
    with psycopg.connect(db_dsn) as paused:  # a transaction left open, as if frozen
        row = paused.execute(QUERIES["rescuer_try_lock"], {"key": 2, "idle_ms": 300}).fetchone()
        assert row is not None and row[0] is True
        assert not tick(db_dsn).leader  # held: nobody else may rescue
        wait_for(lambda: tick(db_dsn).leader, timeout=10, message="leadership to come back")
        # when it wakes, its session is gone (and so is all it held): to the code
        # that is one more lost connection, retried like any other
        with pytest.raises(DatabaseUnavailable), translate():
            paused.execute("SELECT 1")
    with connect(db_dsn) as conn:
        assert job_row(conn, job_id)["state"] == "queued"


def test_a_handler_transaction_paused_after_its_completion_lets_the_job_go(
    db_dsn: str,
) -> None:
    """ctx.transaction() holds the job's row lock from its fenced completion to its
    COMMIT. A worker frozen or cut off in between would keep the job out of the
    rescuer's reach (SKIP LOCKED passes over it) until TCP keepalive gave up; the
    completion sets an idle limit, so the server ends that session and rolls it back
    (effect included), and the lapsed lease is rescued as usual."""
    job_id, token = _expired_running(db_dsn)
    finish = Finish(job_id, token, JobState.SUCCEEDED, AttemptOutcome.SUCCEEDED)
    with psycopg.connect(db_dsn) as paused:  # a transaction left open, as if frozen
        paused.execute(
            "INSERT INTO deadman.effects (job_id, lease_token) VALUES (%s, %s)", (job_id, token)
        )
        assert SyncStore().job_succeed_in(paused, finish, idle_ms=300)
        assert tick(db_dsn).requeued == []  # locked: the rescuer passes over it
        wait_for(lambda: tick(db_dsn).requeued == [job_id], timeout=10, message="the rescue")
        with pytest.raises(DatabaseUnavailable), translate():
            paused.execute("SELECT 1")  # it wakes: its session is gone
    with connect(db_dsn) as conn:
        row = job_row(conn, job_id)
        effects = conn.execute(
            "SELECT count(*) AS n FROM deadman.effects WHERE job_id = %s", (job_id,)
        ).fetchone()
    assert (row["state"], row["rescues"]) == ("queued", 1)
    assert effects is not None and effects["n"] == 0  # rolled back with the completion


def test_the_migration_lock_does_not_block_the_rescuer(db_dsn: str) -> None:
    with psycopg.connect(db_dsn) as migrator:
        migrator.execute(QUERIES["migrations_lock"])
        assert tick(db_dsn).leader


# ------------------------------------------------------------------- retention


def test_retention(db_dsn: str) -> None:
    cases = [  # (state, finished this long ago, pruned by the default retention)
        ("succeeded", 25 * HOUR, True),
        ("succeeded", 23 * HOUR, False),
        ("dead", 8 * DAY, True),
        ("dead", 6 * DAY, False),
        ("cancelled", 8 * DAY, True),
        ("cancelled", 6 * DAY, False),
    ]
    with connect(db_dsn) as conn:
        ids = []
        for token, (state, ago, _) in enumerate(cases, start=1):
            job_id = insert_job(conn, state=state, finished_ago_s=ago).id
            conn.execute(
                "INSERT INTO deadman.attempt_log (lease_token, job_id, attempt, worker, started_at,"
                " outcome) VALUES (%s, %s, 1, 'w', now() - interval '30 days', 'failed')",
                (-token, job_id),
            )
            ids.append(job_id)
        # unfinished jobs are never pruned, however old
        old_queued = insert_job(conn, run_in_s=-30 * DAY).id
        report = clean(db_dsn)  # defaults: succeeded 24 h, dead/cancelled 7 days
        left = {r["id"] for r in conn.execute("SELECT id FROM deadman.jobs")}
        history = {r["job_id"] for r in conn.execute("SELECT job_id FROM deadman.attempts")}
    expected_gone = {i for i, (_, _, pruned) in zip(ids, cases, strict=True) if pruned}
    assert report.pruned == len(expected_gone) == 3
    assert left == (set(ids) - expected_gone) | {old_queued}
    assert history == set(ids) - expected_gone  # history goes with the job


def test_retention_follows_the_settings(db_dsn: str) -> None:
    settings = Settings(retention_succeeded_s=60, retention_failed_s=120)
    with connect(db_dsn) as conn:
        gone = [
            insert_job(conn, state="succeeded", finished_ago_s=61).id,
            insert_job(conn, state="dead", finished_ago_s=121).id,
        ]
        kept = [
            insert_job(conn, state="succeeded", finished_ago_s=59).id,
            insert_job(conn, state="dead", finished_ago_s=119).id,
        ]
        assert clean(db_dsn, settings).pruned == 2
        left = [r["id"] for r in conn.execute("SELECT id FROM deadman.jobs ORDER BY id")]
    assert left == kept and not set(gone) & set(left)


def test_retention_deletes_a_finished_workflow_once_its_nodes_are_gone(db_dsn: str) -> None:
    """Retention 60 s (succeeded) / 300 s (dead). x finished 10 minutes ago with both
    nodes succeeded: nodes pruned, then the workflow. y finished then too, but its
    dead node is a minute old and kept, so y stays. z is still running: it stays."""
    settings = Settings(retention_succeeded_s=60, retention_failed_s=300)
    wf = {"nodes": [{"name": "a", "type": "noop"}, {"name": "b", "type": "noop"}]}
    with api_client(db_dsn) as c:
        ids = [int(c.post("/workflows", json={"name": n, **wf}).json()["id"]) for n in "xyz"]
    done, failed, running = ids
    with connect(db_dsn) as conn:
        # x: both nodes succeeded long ago; y: one dead a minute ago; z: still running
        conn.execute(
            "UPDATE deadman.jobs SET state = 'succeeded', finished_at = now() - interval '10"
            " minutes' WHERE workflow_id = %s OR (workflow_id = %s AND node = 'a')",
            (done, failed),
        )
        conn.execute(
            "UPDATE deadman.jobs SET state = 'dead', finished_at = now() - interval '1 minute'"
            " WHERE workflow_id = %s AND node = 'b'",
            (failed,),
        )
        conn.execute(
            "UPDATE deadman.workflows SET finished_at = now() - interval '10 minutes'"
            " WHERE id = ANY(%s)",
            ([done, failed],),
        )
        report = clean(db_dsn, settings)
        left = {r["id"] for r in conn.execute("SELECT id FROM deadman.workflows")}
        nodes_left = {
            (r["workflow_id"], r["node"])
            for r in conn.execute("SELECT workflow_id, node FROM deadman.jobs")
        }
    assert report.pruned == 3  # x.a, x.b, y.a (succeeded 10 minutes ago)
    assert report.workflows_pruned == 1
    assert left == {failed, running}
    assert nodes_left == {(failed, "b"), (running, "a"), (running, "b")}


# ------------------------------------------------- rescuer vs completion, both orders


@contextmanager
def two_connections(dsn: str) -> Iterator[tuple[psycopg.Connection[DictRow], ...]]:
    """(worker, rescuer): non-autocommit, so each test drives its own transactions."""
    with connect(dsn, autocommit=False) as worker, connect(dsn, autocommit=False) as rescuer:
        yield worker, rescuer


def _complete(conn: psycopg.Connection[DictRow], job_id: int, token: int) -> list[int]:
    finish = Finish(job_id, token, JobState.SUCCEEDED, AttemptOutcome.SUCCEEDED)
    rows = conn.execute(QUERIES["job_finish_many"], finish_params([finish])).fetchall()
    return [int(r["id"]) for r in rows]


def _rescue(conn: psycopg.Connection[DictRow]) -> list[int]:
    lock = conn.execute(QUERIES["rescuer_try_lock"], {"key": 2, "idle_ms": 60_000}).fetchone()
    assert lock is not None and lock["leader"] is True
    rows = conn.execute(
        QUERIES["job_rescue_expired"], {"max_rescues": 5, "quarantine_at": 5, "limit": 1000}
    ).fetchall()
    return [int(r["id"]) for r in rows]


def _expired_running(dsn: str) -> tuple[int, int]:
    with connect(dsn) as conn:
        job = insert_job(conn, state="running", lease_expires_in_s=-10)
    assert job.lease_token is not None
    return job.id, job.lease_token


def test_completion_first_rescuer_skips_the_row(db_dsn: str) -> None:
    # The worker's completion (its lease lapsed, but its token is still the current one)
    # has updated the row and not yet committed when the rescuer runs.
    job_id, token = _expired_running(db_dsn)
    with two_connections(db_dsn) as (worker, rescuer):
        assert _complete(worker, job_id, token) == [job_id]
        assert _rescue(rescuer) == []  # SKIP LOCKED: left alone, not waited for
        rescuer.commit()
        worker.commit()
    with connect(db_dsn) as conn:
        assert job_row(conn, job_id)["state"] == "succeeded"
        assert job_row(conn, job_id)["rescues"] == 0
        assert [a["outcome"] for a in attempt_rows(conn, job_id)] == ["succeeded"]


def test_completion_that_rolls_back_is_rescued_next_tick(db_dsn: str) -> None:
    job_id, token = _expired_running(db_dsn)
    with two_connections(db_dsn) as (worker, rescuer):
        assert _complete(worker, job_id, token) == [job_id]
        assert _rescue(rescuer) == []
        rescuer.commit()
        worker.rollback()  # e.g. the handler's effect failed inside ctx.transaction()
        assert _rescue(rescuer) == [job_id]
        rescuer.commit()
    with connect(db_dsn) as conn:
        assert job_row(conn, job_id)["state"] == "queued"
        assert [a["outcome"] for a in attempt_rows(conn, job_id)] == ["lease_expired"]


def test_rescuer_first_completion_finds_its_lease_gone(db_dsn: str) -> None:
    job_id, token = _expired_running(db_dsn)
    with two_connections(db_dsn) as (worker, rescuer):
        assert _rescue(rescuer) == [job_id]
        rescuer.commit()
        assert _complete(worker, job_id, token) == []  # lease lost
        worker.commit()
    with connect(db_dsn) as conn:
        row = job_row(conn, job_id)
        assert (row["state"], row["rescues"], row["result"]) == ("queued", 1, None)
        assert [a["outcome"] for a in attempt_rows(conn, job_id)] == ["lease_expired"]


def _backend_pid(conn: psycopg.Connection[Any]) -> int:
    return int(conn.info.backend_pid)


def _waits_on_a_lock(dsn: str, pid: int) -> Callable[[], bool]:
    def check() -> bool:
        with psycopg.connect(dsn, autocommit=True) as probe:
            row = probe.execute(
                "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid,)
            ).fetchone()
        return row is not None and row[0] == "Lock"

    return check


def test_rescuer_commits_while_completion_waits(db_dsn: str) -> None:
    # The completion arrives while the rescuer's update is uncommitted: it waits for the
    # row lock, then re-checks its fence against the committed row and matches nothing.
    job_id, token = _expired_running(db_dsn)
    result: list[list[int]] = []
    with two_connections(db_dsn) as (worker, rescuer):
        assert _rescue(rescuer) == [job_id]
        thread = threading.Thread(target=lambda: result.append(_complete(worker, job_id, token)))
        thread.start()
        try:
            wait_for(
                _waits_on_a_lock(db_dsn, _backend_pid(worker)),
                timeout=10,
                message="the completion to block on the rescuer's row lock",
            )
        finally:
            rescuer.commit()
            thread.join(timeout=10)
        assert not thread.is_alive()
        worker.commit()
    assert result == [[]]
    with connect(db_dsn) as conn:
        assert job_row(conn, job_id)["state"] == "queued"
        assert [a["outcome"] for a in attempt_rows(conn, job_id)] == ["lease_expired"]


def test_completion_commits_while_rescuer_would_have_waited(db_dsn: str) -> None:
    # The rescuer's snapshot is taken before the completion commits; SKIP LOCKED means it
    # never waits, and a later tick finds the row no longer running.
    job_id, token = _expired_running(db_dsn)
    with two_connections(db_dsn) as (worker, rescuer):
        lock = rescuer.execute(
            QUERIES["rescuer_try_lock"], {"key": 2, "idle_ms": 60_000}
        ).fetchone()
        assert lock is not None and lock["leader"]
        assert _complete(worker, job_id, token) == [job_id]
        rows = rescuer.execute(
            QUERIES["job_rescue_expired"], {"max_rescues": 5, "quarantine_at": 5, "limit": 1000}
        ).fetchall()
        assert rows == []
        worker.commit()
        assert _rescue(rescuer) == []  # the next tick: nothing is running any more
        rescuer.commit()
    with connect(db_dsn) as conn:
        assert job_row(conn, job_id)["state"] == "succeeded"
        assert [a["outcome"] for a in attempt_rows(conn, job_id)] == ["succeeded"]
