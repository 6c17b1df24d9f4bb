"""Waiting for a job to end (deadman.waiting) against real Postgres: woken by the
notification (the poll set to 10-30 s, so a poll cannot be what woke it), answered at
once for a job that already ended, the timeout, an unknown id, a notification lost
while the listener was away, forged notifications, many waits on one listener, the
sync Waiter, the least-privilege role, and the HTTP long-poll (GET /jobs/{id}?wait_ms=N).

Jobs are ended by the statements the fleet runs (job_finish_many, job_cancel, ...),
on connections of the test's own; tests/acceptance/test_tasks_process.py waits on jobs
a real worker process runs."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import httpx
import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from deadman.db.queries import QUERIES
from deadman.errors import NotFound
from deadman.model import AttemptOutcome, Job, JobState
from deadman.store import Finish, finish_params
from deadman.waiting import APPLICATION_NAME, AsyncWaiter, Waiter, WaiterClosed, WaitTimeout
from tests.factories import connect, insert_job
from tests.helpers import wait_for, wait_for_async
from tests.helpers.api import make_app, serve

T = TypeVar("T")
#: longer than any test here waits: what wakes a wait is the notification, or the
#: poll done at once when the listener connects again, never the periodic poll
SLOW_POLL_S = 30.0
#: notification latency on a loaded 2-core machine, with room
PROMPT_S = 2.0


def ending(job_id: int, token: int | None, state: JobState = JobState.SUCCEEDED) -> Finish:
    """How the completer ends a running attempt (fenced by its token)."""
    assert token is not None
    ok = state is JobState.SUCCEEDED
    outcome = AttemptOutcome.SUCCEEDED if ok else AttemptOutcome.FAILED
    return Finish(
        job_id,
        token,
        state,
        outcome,
        result={"sum": 3} if ok else None,
        error=None if ok else "it broke",
    )


def finish(dsn: str, job_id: int, token: int | None, state: JobState = JobState.SUCCEEDED) -> None:
    with connect(dsn) as conn:
        rows = conn.execute(
            QUERIES["job_finish_many"], finish_params([ending(job_id, token, state)])
        ).fetchall()
    assert [r["id"] for r in rows] == [job_id]


def listeners(dsn: str, *, terminate: bool = False) -> int:
    """The waiters' LISTEN backends on this database; killed with ``terminate``."""
    with connect(dsn) as conn:
        rows = conn.execute(
            "SELECT pid, CASE WHEN %s THEN pg_terminate_backend(pid) END AS killed"
            " FROM pg_stat_activity WHERE application_name = %s AND datname = current_database()",
            (terminate, APPLICATION_NAME),
        ).fetchall()
    return len(rows)


def flagged(dsn: str, job_id: int) -> bool:
    with connect(dsn) as conn:
        row = conn.execute("SELECT waited FROM deadman.jobs WHERE id = %s", (job_id,)).fetchone()
    return bool(row and row["waited"])


def with_waiter(dsn: str, body: Callable[[AsyncWaiter], Awaitable[T]], **kw: Any) -> T:
    async def main() -> T:
        async with AsyncWaiter(dsn, **kw) as waiter:
            return await body(waiter)

    return asyncio.run(main())


async def end_when_flagged(dsn: str, job_id: int, end: Callable[[], None]) -> float:
    """Once the wait has flagged the job, end it (in a thread: the statement blocks);
    returns the monotonic time it ended."""
    await wait_for_async(lambda: flagged(dsn, job_id), 10, message="the job to be flagged")
    await asyncio.to_thread(end)
    return time.monotonic()


async def flagged_wait(dsn: str, waiter: AsyncWaiter, job_id: int) -> asyncio.Task[Job]:
    """A wait on the job, running, once it has flagged the job."""
    waiting = asyncio.create_task(waiter.wait(job_id, timeout=20))
    await wait_for_async(lambda: flagged(dsn, job_id), 10, message="the job to be flagged")
    return waiting


def test_a_wait_is_woken_by_the_notification(db_dsn: str) -> None:
    with connect(db_dsn) as conn:
        job = insert_job(conn, state="running")

    async def body(waiter: AsyncWaiter) -> tuple[Job, float]:
        waiting = asyncio.create_task(waiter.wait(job.id, timeout=20))
        ended = await end_when_flagged(
            db_dsn, job.id, lambda: finish(db_dsn, job.id, job.lease_token)
        )
        done = await waiting
        return done, time.monotonic() - ended

    done, latency = with_waiter(db_dsn, body, poll_s=SLOW_POLL_S)
    assert done.state is JobState.SUCCEEDED and done.result == {"sum": 3}
    assert latency < PROMPT_S, f"{latency:.2f} s after the end: not the notification"


def test_an_ended_job_is_answered_at_once_and_an_unknown_id_refused(db_dsn: str) -> None:
    with connect(db_dsn) as conn:
        dead = insert_job(conn, state="dead", last_error="boom")

    async def body(waiter: AsyncWaiter) -> tuple[Job, float]:
        started = time.monotonic()
        done = await waiter.wait(dead.id, timeout=10)
        took = time.monotonic() - started
        with pytest.raises(NotFound, match="no job 999999"):
            await waiter.wait(999_999, timeout=10)
        return done, took

    done, took = with_waiter(db_dsn, body, poll_s=SLOW_POLL_S)
    assert done.state is JobState.DEAD and done.last_error == "boom"
    assert took < PROMPT_S


def test_the_timeout_names_the_job_and_its_state(db_dsn: str) -> None:
    with connect(db_dsn) as conn:
        queued = insert_job(conn, state="queued")

    async def body(waiter: AsyncWaiter) -> float:
        started = time.monotonic()
        with pytest.raises(WaitTimeout) as caught:
            await waiter.wait(queued.id, timeout=0.3)
        assert caught.value.job_id == queued.id and caught.value.state is JobState.QUEUED
        assert str(caught.value) == f"job {queued.id} did not end within 0.3 s (it is queued)"
        with pytest.raises(WaitTimeout):
            await waiter.wait(queued.id, timeout=0)  # one look, no wait
        return time.monotonic() - started

    took = with_waiter(db_dsn, body, poll_s=SLOW_POLL_S)
    assert 0.3 <= took < 0.3 + PROMPT_S


@pytest.mark.parametrize("timeout", [-1, float("nan"), float("inf")])
def test_a_nonsense_timeout_is_refused(db_dsn: str, timeout: float) -> None:
    with Waiter(db_dsn) as waiter, pytest.raises(ValueError, match="timeout"):
        waiter.wait(1, timeout)


def test_a_notification_lost_while_the_listener_was_away_does_not_hang_the_wait(
    db_dsn: str,
) -> None:
    """The job ends while nobody is told (the trigger off: what a listener that was
    disconnected at that moment misses), then the listener's backend is killed: the
    poll made as it connects again answers the wait, long before the next poll."""
    with connect(db_dsn) as conn:
        job = insert_job(conn, state="running")

    def end_unheard() -> None:
        with psycopg.connect(db_dsn) as conn:
            conn.execute("ALTER TABLE deadman.jobs DISABLE TRIGGER jobs_notify_done")
            conn.execute(
                QUERIES["job_finish_many"], finish_params([ending(job.id, job.lease_token)])
            )
            conn.execute("ALTER TABLE deadman.jobs ENABLE TRIGGER jobs_notify_done")

    async def body(waiter: AsyncWaiter) -> tuple[Job, float, int]:
        waiting = asyncio.create_task(waiter.wait(job.id, timeout=20))
        ended = await end_when_flagged(db_dsn, job.id, end_unheard)
        await asyncio.sleep(0.3)
        assert not waiting.done(), "answered with nobody notified and no poll due"
        killed = await asyncio.to_thread(listeners, db_dsn, terminate=True)
        done = await waiting
        return done, time.monotonic() - ended, killed

    done, latency, killed = with_waiter(db_dsn, body, poll_s=SLOW_POLL_S)
    assert killed == 1
    assert done.state is JobState.SUCCEEDED
    assert latency < 0.3 + 2 * PROMPT_S


def test_forged_notifications_wake_nothing_and_break_nothing(db_dsn: str) -> None:
    """NOTIFY needs no privilege: a payload is only a hint to look. A running job's id,
    junk and an unknown id change no answer; the real end still does."""
    with connect(db_dsn) as conn:
        job = insert_job(conn, state="running")

    async def body(waiter: AsyncWaiter) -> Job:
        waiting = await flagged_wait(db_dsn, waiter, job.id)
        with connect(db_dsn) as conn:
            for payload in (str(job.id), "", "x" * 7000, "-1", "1e3", "99999999999999999999", "²"):
                conn.execute("SELECT pg_notify('deadman_done', %s)", (payload,))
        await asyncio.sleep(0.5)
        assert not waiting.done()
        await asyncio.to_thread(finish, db_dsn, job.id, job.lease_token)
        return await waiting

    assert with_waiter(db_dsn, body, poll_s=SLOW_POLL_S).state is JobState.SUCCEEDED


def test_every_way_a_job_ends_wakes_its_wait(db_dsn: str) -> None:
    """The trigger covers each path: a finish (dead), a cancel, the expirer, the
    rescuer's poison pill, and the cascade that cancels a waiting dependent."""
    with connect(db_dsn) as conn:
        running = insert_job(conn, state="running")
        queued = insert_job(conn, state="queued")
        expiring = insert_job(conn, state="queued")
        conn.execute(
            "UPDATE deadman.jobs SET start_by = now() - interval '1 s' WHERE id = %s",
            (expiring.id,),
        )
        poison = insert_job(  # alone on its worker: dead, not requeued
            conn, state="running", rescues=5, lease_expires_in_s=-10, lease_worker="alone"
        )
        up = insert_job(conn, state="running")
        down = insert_job(conn, state="waiting")
        conn.execute("UPDATE deadman.jobs SET pending_deps = 1 WHERE id = %s", (down.id,))
        conn.execute("UPDATE deadman.jobs SET has_dependents = true WHERE id = %s", (up.id,))
        conn.execute(
            "INSERT INTO deadman.job_deps (job_id, depends_on) VALUES (%s, %s)", (down.id, up.id)
        )

    def run(query: str, params: dict[str, Any]) -> Callable[[], None]:
        def go() -> None:
            with connect(db_dsn) as conn:
                conn.execute(QUERIES[query], params)

        return go

    ends = {
        running.id: lambda: finish(db_dsn, running.id, running.lease_token, JobState.DEAD),
        queued.id: run("job_cancel", {"id": queued.id}),
        expiring.id: run("job_expire", {"limit": 100}),
        poison.id: run("job_rescue_expired", {"max_rescues": 5, "quarantine_at": 5, "limit": 100}),
        down.id: lambda: finish(db_dsn, up.id, up.lease_token, JobState.DEAD),
    }

    async def body(waiter: AsyncWaiter) -> dict[int, JobState]:
        got: dict[int, JobState] = {}
        for job_id, end in ends.items():
            waiting = asyncio.create_task(waiter.wait(job_id, timeout=20))
            ended = await end_when_flagged(db_dsn, job_id, end)
            got[job_id] = (await waiting).state
            assert time.monotonic() - ended < PROMPT_S, job_id
        return got

    got = with_waiter(db_dsn, body, poll_s=SLOW_POLL_S)
    assert got == {
        running.id: JobState.DEAD,
        queued.id: JobState.CANCELLED,
        expiring.id: JobState.DEAD,
        poison.id: JobState.DEAD,
        down.id: JobState.CANCELLED,
    }


def test_many_waits_share_one_listener(db_dsn: str) -> None:
    """200 waits (two on each of 100 jobs) on one waiter: one LISTEN connection, every
    wait answered once the batch that ends all the jobs commits."""
    with connect(db_dsn) as conn:
        jobs = [insert_job(conn, state="running") for _ in range(100)]

    def end_all() -> None:
        with connect(db_dsn) as conn:
            finishes = [ending(j.id, j.lease_token) for j in jobs]
            conn.execute(QUERIES["job_finish_many"], finish_params(finishes))

    async def body(waiter: AsyncWaiter) -> tuple[list[Job], float, int]:
        waits = [asyncio.create_task(waiter.wait(j.id, timeout=30)) for j in jobs for _ in "ab"]
        await wait_for_async(
            lambda: all(flagged(db_dsn, j.id) for j in jobs[-3:]), 10, message="the flags"
        )
        n = await asyncio.to_thread(listeners, db_dsn)
        await asyncio.to_thread(end_all)
        ended = time.monotonic()
        done = await asyncio.gather(*waits)
        return done, time.monotonic() - ended, n

    done, latency, n = with_waiter(db_dsn, body, poll_s=SLOW_POLL_S)
    assert n == 1
    assert [d.id for d in done] == [j.id for j in jobs for _ in "ab"]
    assert {d.state for d in done} == {JobState.SUCCEEDED}
    assert latency < 2 * PROMPT_S


def test_a_job_deleted_while_waited_on_is_not_found(db_dsn: str) -> None:
    with connect(db_dsn) as conn:
        job = insert_job(conn, state="queued")

    async def body(waiter: AsyncWaiter) -> None:
        waiting = await flagged_wait(db_dsn, waiter, job.id)
        with connect(db_dsn) as conn:
            conn.execute("DELETE FROM deadman.jobs WHERE id = %s", (job.id,))
        with pytest.raises(NotFound, match="deleted while waited on"):
            await waiting

    with_waiter(db_dsn, body, poll_s=0.2)


@pytest.mark.parametrize("turns", [0, 1, 2, 3, 4])
def test_closing_ends_the_checker_even_when_a_kick_races_the_cancel(
    db_dsn: str, turns: int
) -> None:
    """Python 3.11's asyncio.wait_for returns the inner result instead of raising when
    a task is cancelled just as what it waits for completes: the checker's wait on a
    kick swallowed close()'s cancel and went back to a 30 s wait, and close() waited on
    it (a fresh-clone suite: test_closing_a_waiter_ends_its_waits timed out at 300 s).
    A kick (the listener connecting, a notification) lands 0-4 loop turns before the
    close here; close must finish either way."""

    async def main() -> None:
        waiter = AsyncWaiter(db_dsn, poll_s=SLOW_POLL_S)
        await waiter._start()
        await asyncio.sleep(0.05)  # the checker waits on its kick
        waiter._kick.set()
        for _ in range(turns):
            await asyncio.sleep(0)
        await asyncio.wait_for(waiter.close(), 10)

    asyncio.run(main())


def test_closing_a_waiter_ends_its_waits(db_dsn: str) -> None:
    """A server stopping closes its waiter: the waits in flight end with WaiterClosed
    (the long-poll then answers with the job as it is), and no new one starts."""
    with connect(db_dsn) as conn:
        job = insert_job(conn, state="queued")

    async def main() -> None:
        waiter = AsyncWaiter(db_dsn, poll_s=SLOW_POLL_S)
        waiting = await flagged_wait(db_dsn, waiter, job.id)
        await waiter.close()
        with pytest.raises(WaiterClosed, match="the waiter was closed"):
            await waiting
        with pytest.raises(WaiterClosed, match="this waiter is closed"):
            await waiter.wait(job.id, timeout=1)
        await wait_for_async(lambda: listeners(db_dsn) == 0, 10, message="the listener gone")

    asyncio.run(main())


def test_the_sync_waiter_serves_many_threads(db_dsn: str) -> None:
    with connect(db_dsn) as conn:
        jobs = [insert_job(conn, state="running") for _ in range(8)]
    got: dict[int, JobState] = {}
    errors: list[BaseException] = []

    def wait_one(job_id: int, waiter: Waiter) -> None:
        try:
            got[job_id] = waiter.wait(job_id, timeout=20).state
        except BaseException as exc:
            errors.append(exc)

    with Waiter(db_dsn, poll_s=SLOW_POLL_S) as waiter:
        threads = [threading.Thread(target=wait_one, args=(j.id, waiter)) for j in jobs]
        for t in threads:
            t.start()
        wait_for(lambda: all(flagged(db_dsn, j.id) for j in jobs), 10, message="the flags")
        ended = time.monotonic()
        for j in jobs:
            finish(db_dsn, j.id, j.lease_token)
        for t in threads:
            t.join(20)
        latency = time.monotonic() - ended
    assert not errors, errors
    assert got == {j.id: JobState.SUCCEEDED for j in jobs}
    assert latency < 2 * PROMPT_S


def test_a_wait_works_as_the_api_role(db_dsn: str) -> None:
    """deadman_api may flag a job (the column grant) and listen."""
    with connect(db_dsn) as conn:
        job = insert_job(conn, state="running")
    as_role = make_conninfo(db_dsn, options="-c role=deadman_api")

    async def body(waiter: AsyncWaiter) -> Job:
        waiting = asyncio.create_task(waiter.wait(job.id, timeout=20))
        await end_when_flagged(db_dsn, job.id, lambda: finish(db_dsn, job.id, job.lease_token))
        return await waiting

    assert with_waiter(as_role, body, poll_s=SLOW_POLL_S).state is JobState.SUCCEEDED


# ----------------------------------------------------------------------------- HTTP


def test_the_long_poll_answers_at_the_end_or_after_wait_ms(db_dsn: str) -> None:
    """GET /jobs/{id}?wait_ms=N: the ended job as soon as it ends; an unfinished one
    after N ms, as it is then (200 both); a dead one at once; 404 for no such job. A
    pool of 2 connections serves 20 long-polls at once and a plain read meanwhile:
    a long-poll holds no connection while it waits."""
    with connect(db_dsn) as conn:
        running = insert_job(conn, state="running")
        queued = [insert_job(conn, state="queued") for _ in range(20)]
        dead = insert_job(conn, state="dead", last_error="boom")
    app = make_app(db_dsn, pool_max_size=2)
    with serve(app) as base:
        with httpx.Client(base_url=base, timeout=30) as c:
            started = time.monotonic()
            r = c.get(f"/jobs/{dead.id}", params={"wait_ms": 20000})
            assert r.status_code == 200 and r.json()["state"] == "dead"
            assert time.monotonic() - started < PROMPT_S
            assert c.get("/jobs/999999", params={"wait_ms": 100}).status_code == 404

        async def polls() -> tuple[list[httpx.Response], httpx.Response, float, float]:
            async with httpx.AsyncClient(base_url=base, timeout=30) as ac:
                held = [ac.get(f"/jobs/{q.id}", params={"wait_ms": 1500}) for q in queued]
                waiting = asyncio.create_task(
                    ac.get(f"/jobs/{running.id}", params={"wait_ms": 20000})
                )
                started = time.monotonic()
                many = asyncio.gather(*held)
                await wait_for_async(lambda: flagged(db_dsn, running.id), 10, message="the flag")
                plain = await ac.get(f"/jobs/{running.id}")
                read_in = time.monotonic() - started
                ended = await end_when_flagged(
                    db_dsn, running.id, lambda: finish(db_dsn, running.id, running.lease_token)
                )
                done = await waiting
                latency = time.monotonic() - ended
                return [*await many, done], plain, read_in, latency

        answers, plain, read_in, latency = asyncio.run(polls())
    *timed_out, done = answers
    assert plain.status_code == 200 and plain.json()["state"] == "running"
    assert read_in < 1.5, "a plain read waited behind the long-polls"
    assert all(r.status_code == 200 and r.json()["state"] == "queued" for r in timed_out)
    assert done.status_code == 200 and done.json()["state"] == "succeeded"
    assert done.json()["result"] == {"sum": 3}
    assert latency < PROMPT_S
