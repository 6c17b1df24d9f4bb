"""The completer's refill (DECISIONS 45, 62): the slots a batch of outcomes frees are
claimed again in the statement that writes the batch (job_finish_claim). Against a
real database: the fence still holds inside the shared statement, a claim that fails
takes no outcome down with it, a queue last seen drained gets no refill, and a busy
worker that refills every slot still gets to its quarantine check."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import replace
from functools import partial

import psycopg
import pytest
from psycopg.rows import DictRow

from deadman.client import Client
from deadman.model import AttemptOutcome, Job, JobState
from deadman.registry import Registry
from deadman.store import AsyncStore, ClaimParams, Finish
from deadman.worker import producer
from deadman.worker.completer import Completer
from deadman.worker.context import JobContext
from tests.factories import connect, insert_job, run_async
from tests.helpers import wait_for
from tests.helpers.worker import SETTINGS, running_worker

QUEUE = "refill"


def _claim(limit: int, ttl_ms: int = 30_000) -> ClaimParams:
    return ClaimParams(QUEUE, "refill-worker", limit, ttl_ms, keyed=False)  # as refills are


def _succeeded(job_id: int, token: int) -> Finish:
    return Finish(job_id, token, JobState.SUCCEEDED, AttemptOutcome.SUCCEEDED)


def _state(conn: psycopg.Connection[DictRow], job_id: int) -> DictRow:
    row = conn.execute(
        "SELECT state, lease_token, attempt FROM deadman.jobs WHERE id = %s", (job_id,)
    ).fetchone()
    assert row is not None
    return row


def test_a_stale_outcome_is_refused_and_the_claim_in_its_transaction_stands(
    db_dsn: str,
) -> None:
    with connect(db_dsn) as conn:
        mine = insert_job(conn, state="running", queue=QUEUE)
        theirs = insert_job(conn, state="running", queue=QUEUE)  # lease moved on
        due = insert_job(conn, state="queued", queue=QUEUE, run_in_s=-1)
        assert mine.lease_token is not None and theirs.lease_token is not None
        mine_token, stale_token = mine.lease_token, theirs.lease_token + 1000

        async def main() -> tuple[set[int], list[Job]]:
            store = AsyncStore.create(db_dsn, min_size=1, max_size=2, retry_s=0.0)
            await store.open(wait=True, timeout=10.0)
            try:
                return await store.job_finish_claim(
                    [
                        _succeeded(mine.id, mine_token),
                        _succeeded(theirs.id, stale_token),
                    ],
                    _claim(5),
                )
            finally:
                await store.close()

        done, jobs = run_async(main)
        assert done == {mine.id}
        assert [j.id for j in jobs] == [due.id]
        assert jobs[0].lease is not None and jobs[0].lease.worker == "refill-worker"
        assert _state(conn, mine.id)["state"] == "succeeded"
        stale = _state(conn, theirs.id)
        assert (stale["state"], stale["lease_token"]) == ("running", theirs.lease_token)
        assert _state(conn, due.id)["state"] == "running"
        attempts = conn.execute("SELECT job_id FROM deadman.attempts ORDER BY job_id").fetchall()
        assert [r["job_id"] for r in attempts] == [mine.id]


def test_a_claim_that_fails_rolls_back_alone_and_the_outcomes_are_written(
    db_dsn: str,
) -> None:
    """A claim the database refuses (here a lease too long for an interval) aborts the
    shared transaction; the completer then writes the outcomes on their own, each
    submitter hears True, and nothing was claimed."""
    with connect(db_dsn) as conn:
        held = [insert_job(conn, state="running", queue=QUEUE) for _ in range(3)]
        due = insert_job(conn, state="queued", queue=QUEUE, run_in_s=-1)
        claimed: list[Job] = []
        asked: list[int] = []

        def refill(freed: int) -> ClaimParams:
            asked.append(freed)
            return _claim(freed, ttl_ms=2**62)

        async def main() -> list[bool]:
            store = AsyncStore.create(db_dsn, min_size=1, max_size=2, retry_s=0.0)
            await store.open(wait=True, timeout=10.0)
            try:
                completer = Completer(store, "refill-worker", batch_max=10)
                completer.refill = refill
                completer.on_claimed = lambda _claim, jobs, _sent: claimed.extend(jobs)
                runner = asyncio.create_task(completer.run())
                results = await asyncio.gather(
                    *(
                        completer.submit(
                            _succeeded(j.id, j.lease_token or 0), QUEUE, frees_slot=True
                        )
                        for j in held
                    )
                )
                completer.stop()
                await asyncio.wait_for(runner, 10)
                await asyncio.wait_for(completer.refills_settled(), 1)
                return results
            finally:
                await store.close()

        assert run_async(main) == [True, True, True]
        assert asked and sum(asked) == 3  # one refill per flush, for that flush's slots
        assert claimed == []
        assert {_state(conn, j.id)["state"] for j in held} == {"succeeded"}
        assert _state(conn, due.id)["state"] == "queued"


def test_outcomes_whose_slot_stays_taken_ask_for_no_refill(db_dsn: str) -> None:
    """A sync handler's thread that outlived its timeout keeps its slot: its outcome
    must not pay for a claim (``frees_slot`` False), so the refill is not asked."""
    with connect(db_dsn) as conn:
        job = insert_job(conn, state="running", queue=QUEUE)
        asked: list[int] = []

        def refill(freed: int) -> ClaimParams | None:
            asked.append(freed)
            return None

        async def main() -> bool:
            store = AsyncStore.create(db_dsn, min_size=1, max_size=2, retry_s=0.0)
            await store.open(wait=True, timeout=10.0)
            try:
                completer = Completer(store, "refill-worker")
                completer.refill = refill
                runner = asyncio.create_task(completer.run())
                ok = await completer.submit(_succeeded(job.id, job.lease_token or 0), QUEUE)
                completer.stop()
                await asyncio.wait_for(runner, 10)
                return ok
            finally:
                await store.close()

        assert run_async(main) is True
        assert asked == []
        assert _state(conn, job.id)["state"] == "succeeded"


class RefillCounter(AsyncStore):
    """The real store, recording what each refill claim got."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.refills: list[int] = []

    async def job_finish_claim(
        self, finishes: Sequence[Finish], claim: ClaimParams
    ) -> tuple[set[int], list[Job]]:
        done, jobs = await super().job_finish_claim(finishes, claim)
        self.refills.append(len(jobs))
        return done, jobs


def test_no_refill_while_the_queue_was_last_seen_drained(db_dsn: str) -> None:
    """A claim that came back short means nothing more was waiting: the completions of
    jobs that trickle in one at a time carry no claim (it came back empty every time,
    and cost the write its time). A full claim (a burst) turns the refills back on.
    No slot is parked for handoffs here: with slots parked, a claim can ask only for
    the one slot left unparked, take the trickle's job and so come back full, and the
    next completion then carries one claim, by design (a full claim cannot tell a
    burst from a trickle). Under load that happened in 1 of 12-16 runs (DECISIONS 91's
    retry), with the producer's idle loop of DECISIONS 96 and without it."""
    settings = replace(SETTINGS, concurrency=4, claim_batch=2, queues=(QUEUE,), handoff_slots=0)
    store = RefillCounter.create(db_dsn, min_size=1, max_size=6)
    with (
        Client(db_dsn, settings=settings) as client,
        connect(db_dsn) as conn,
        running_worker(db_dsn, settings=settings, store=store),
    ):
        for n in range(1, 6):
            client.enqueue("t.async", queue=QUEUE)
            wait_for(partial(_ran, conn, n), timeout=15, message=f"job {n} ran")
        assert store.refills == [], "a trickle's completions carried claims"
        client.enqueue_many([client.job("t.async", queue=QUEUE) for _ in range(200)])
        wait_for(lambda: _count(conn, "succeeded") == 205, timeout=60, message="the burst ran")
    assert sum(store.refills) > 0, "a burst's completions claimed nothing"


slow = Registry()


@slow.handler("refill.slow")
async def slow_handler(job: Job, ctx: JobContext) -> None:
    await asyncio.sleep(0.05)


def test_a_worker_busy_refilling_still_runs_a_suspect_alone(
    db_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under steady load every freed slot is refilled with the write, so the producer's
    own loop never sees a free slot. Its quarantine check must still come round: the
    refill stands aside when the check is due, the producer drains, and the suspect
    (rescued QUARANTINE_AT times) runs with nothing else beside it, before the load is
    over."""
    monkeypatch.setattr(producer, "QUARANTINE_CHECK_S", 1.0)
    # a claim as big as the slots: every freed slot is refilled, none left for the loop
    settings = replace(SETTINGS, concurrency=4, claim_batch=4, queues=(QUEUE,))
    with Client(db_dsn, settings=settings) as client, connect(db_dsn) as conn:
        load = client.enqueue_many([client.job("refill.slow", queue=QUEUE) for _ in range(400)])
        with running_worker(db_dsn, settings=settings, handlers=slow) as worker:
            wait_for(lambda: _count(conn, "running") >= 4, timeout=15, message="the worker is busy")
            suspect = insert_job(
                conn, state="queued", type="refill.slow", queue=QUEUE, run_in_s=-1, rescues=5
            )
            wait_for(
                lambda: _state(conn, suspect.id)["state"] == "succeeded",
                timeout=30,
                message="the suspect ran",
            )
            left = conn.execute(
                "SELECT count(*) AS n FROM deadman.jobs WHERE id = ANY(%s)"
                " AND state <> 'succeeded'",
                (load,),
            ).fetchone()
            assert left is not None and left["n"] > 0, "the suspect waited for the load to end"
            wait_for(lambda: _count(conn, "succeeded") == 401, timeout=60, message="the load ran")
            assert worker.claims > 0
        overlap = conn.execute(
            "SELECT count(*) AS n FROM deadman.attempts s JOIN deadman.attempts o"
            " ON o.job_id <> s.job_id AND o.started_at < s.finished_at"
            " AND s.started_at < o.finished_at WHERE s.job_id = %s",
            (suspect.id,),
        ).fetchone()
        assert overlap == {"n": 0}, "another job ran beside the suspect"
        once = conn.execute(
            "SELECT count(*) AS n FROM deadman.attempts GROUP BY job_id HAVING count(*) > 1"
        ).fetchall()
        assert once == []


def _ran(conn: psycopg.Connection[DictRow], n: int) -> bool:
    return _count(conn, "succeeded") == n


def _count(conn: psycopg.Connection[DictRow], state: str) -> int:
    row = conn.execute(
        "SELECT count(*) AS n FROM deadman.jobs WHERE queue = %s AND state = %s", (QUEUE, state)
    ).fetchone()
    assert row is not None
    return int(row["n"])
