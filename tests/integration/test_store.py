"""AsyncStore on a real database: the claim, fenced completion, heartbeats.

Async store methods run through ``with_store`` (``asyncio.run`` in a sync test);
rows are set up with the factory and checked with raw SQL.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from deadman.errors import IllegalTransition, InvalidJob
from deadman.model import AttemptOutcome, Job, JobState
from deadman.store import (
    AsyncStore,
    ClaimLeft,
    ClaimParams,
    Finish,
    HeartbeatParams,
    NewJob,
    RescueParams,
)
from tests.factories import (
    async_store,
    attempt_rows,
    connect,
    db_now,
    expire_lease,
    insert_job,
    job_row,
    run_async,
    with_store,
)

TTL_MS = 30_000
CLAIMABLE = ("queued", "scheduled", "retrying")


def claim(
    dsn: str, queue: str = "default", limit: int = 10, worker: str = "w1", ttl_ms: int = TTL_MS
) -> list[Job]:
    return with_store(
        dsn,
        lambda s: s.job_claim(ClaimParams(queue=queue, worker=worker, limit=limit, ttl_ms=ttl_ms)),
    )


def finish(dsn: str, *finishes: Finish) -> set[int]:
    return with_store(dsn, lambda s: s.job_finish_many(finishes))


def heartbeat(
    dsn: str, leases: list[tuple[int, int]], worker: str = "w1", ttl_ms: int = TTL_MS
) -> dict[int, bool]:
    params = HeartbeatParams(
        worker=worker,
        hostname="host",
        pid=1234,
        queues=["default"],
        concurrency=4,
        ttl_ms=ttl_ms,
        leases=leases,
    )
    return with_store(dsn, lambda s: s.job_heartbeat_many(params))


def rescue(dsn: str, max_rescues: int = 5) -> list[int]:
    rescued = with_store(dsn, lambda s: s.job_rescue_expired(RescueParams(max_rescues)))
    assert rescued is not None
    return [r.id for r in rescued]


def token_of(job: Job) -> int:
    assert job.lease is not None
    return job.lease.token


# --------------------------------------------------------------------------- claim


def test_claim_order_is_priority_then_run_at_then_id(db_dsn: str) -> None:
    with connect(db_dsn) as conn:
        tie = db_now(conn) - timedelta(seconds=20)
        a = insert_job(conn, priority=0, run_in_s=-30).id
        b = insert_job(conn, priority=5, run_in_s=-10).id
        c = insert_job(conn, priority=5, run_at=tie).id
        d = insert_job(conn, priority=-3, run_in_s=-50).id
        e = insert_job(conn, priority=5, run_at=tie).id  # same run_at as c: id decides
        f = insert_job(conn, priority=100, run_in_s=-1).id
    got = [j.id for _ in range(7) for j in claim(db_dsn, limit=1)]
    assert got == [f, c, e, b, a, d]


def test_a_batch_takes_the_best_jobs(db_dsn: str) -> None:
    with connect(db_dsn) as conn:
        low = [insert_job(conn, priority=0, run_in_s=-100).id for _ in range(5)]
        high = [insert_job(conn, priority=1).id for _ in range(3)]
    assert sorted(j.id for j in claim(db_dsn, limit=3)) == sorted(high)
    assert sorted(j.id for j in claim(db_dsn, limit=10)) == sorted(low)


def test_claim_respects_the_limit(db_dsn: str) -> None:
    with connect(db_dsn) as conn:
        for _ in range(10):
            insert_job(conn)
    assert [len(claim(db_dsn, limit=4)) for _ in range(4)] == [4, 4, 2, 0]


def test_due_jobs_are_claimed_future_ones_are_not(db_dsn: str) -> None:
    # Claiming a due 'scheduled' or 'retrying' job is its promotion.
    with connect(db_dsn) as conn:
        due = {insert_job(conn, state=s, run_in_s=-10).id for s in CLAIMABLE}
        for state in CLAIMABLE:
            insert_job(conn, state=state, run_in_s=10)
    got = claim(db_dsn)
    assert {j.id for j in got} == due
    assert {j.state for j in got} == {JobState.RUNNING}
    assert claim(db_dsn) == []


def test_jobs_in_other_states_are_never_claimed(db_dsn: str) -> None:
    with connect(db_dsn) as conn:
        for state in ("waiting", "running", "succeeded", "dead", "cancelled"):
            insert_job(conn, state=state, run_in_s=-60, lease_expires_in_s=-60)
    assert claim(db_dsn) == []


def test_claim_takes_one_queue_only(db_dsn: str) -> None:
    with connect(db_dsn) as conn:
        other = insert_job(conn, queue="other").id
        mine = insert_job(conn, queue="default").id
    assert [j.id for j in claim(db_dsn, queue="default")] == [mine]
    assert [j.id for j in claim(db_dsn, queue="other")] == [other]


def test_a_paused_queue_is_not_claimed(db_dsn: str) -> None:
    with connect(db_dsn) as conn:
        paused = insert_job(conn, queue="q").id
        free = insert_job(conn, queue="free").id
        conn.execute("INSERT INTO deadman.queues (name, paused) VALUES ('q', true)")
        assert claim(db_dsn, queue="q") == []
        assert [j.id for j in claim(db_dsn, queue="free")] == [free]
        conn.execute("UPDATE deadman.queues SET paused = false WHERE name = 'q'")
    assert [j.id for j in claim(db_dsn, queue="q")] == [paused]


def test_claim_sets_the_lease(db_dsn: str) -> None:
    with connect(db_dsn) as conn:
        fresh = insert_job(conn).id
        retried = insert_job(conn, state="retrying", attempt=2, run_in_s=-1).id
        before = db_now(conn)
        jobs = {j.id: j for j in claim(db_dsn, worker="worker-7")}
        after = db_now(conn)
        rows = {i: job_row(conn, i) for i in (fresh, retried)}
    assert jobs[fresh].attempt == 1 and rows[fresh]["attempt"] == 1
    assert jobs[retried].attempt == 3 and rows[retried]["attempt"] == 3
    for job_id, job in jobs.items():
        assert job.state is JobState.RUNNING and rows[job_id]["state"] == "running"
        assert job.lease is not None
        assert job.lease.worker == "worker-7"
        assert job.lease.token == rows[job_id]["lease_token"]
        ttl = timedelta(milliseconds=TTL_MS)
        assert before + ttl <= job.lease.expires_at <= after + ttl
        assert job.started_at is not None and before <= job.started_at <= after


def test_lease_tokens_are_unique_and_increase(db_dsn: str) -> None:
    with connect(db_dsn) as conn:
        for _ in range(10):
            insert_job(conn)
        planted = insert_job(conn, state="running").lease_token
    assert planted is not None
    first = [token_of(j) for j in claim(db_dsn, limit=5)]
    second = [token_of(j) for j in claim(db_dsn, limit=5)]
    assert len(set(first + second)) == 10
    assert min(first) > planted
    assert min(second) > max(first)


def test_a_reclaimed_job_gets_a_new_token(db_dsn: str) -> None:
    with connect(db_dsn) as conn:
        job_id = insert_job(conn).id
        (first,) = claim(db_dsn)
        expire_lease(conn, job_id)
        assert rescue(db_dsn) == [job_id]
        (second,) = claim(db_dsn)
    assert token_of(second) > token_of(first)
    assert second.attempt == 1  # the rescue gave the attempt back


def test_a_locked_row_is_skipped_not_waited_for(db_dsn: str) -> None:
    with connect(db_dsn) as setup:
        locked = insert_job(conn=setup, priority=10).id
        other = insert_job(conn=setup).id
    with psycopg.connect(db_dsn) as holder:
        holder.execute("SELECT 1 FROM deadman.jobs WHERE id = %s FOR UPDATE", (locked,))
        # A short batch: SKIP LOCKED stepped over the best row; it is not an empty queue.
        assert [j.id for j in claim(db_dsn, limit=10)] == [other]
        holder.rollback()
    assert [j.id for j in claim(db_dsn)] == [locked]


def test_two_concurrent_claimers_take_disjoint_sets(db_dsn: str) -> None:
    with connect(db_dsn) as conn:
        conn.execute(
            "INSERT INTO deadman.jobs (type, payload)"
            " SELECT 't', to_jsonb(i) FROM generate_series(1, 200) AS i"
        )
        all_ids = {r["id"] for r in conn.execute("SELECT id FROM deadman.jobs")}

    async def claimer(store: AsyncStore, worker: str) -> list[int]:
        got: list[int] = []
        while True:
            jobs = await store.job_claim(
                ClaimParams(queue="default", worker=worker, limit=7, ttl_ms=TTL_MS)
            )
            if not jobs:
                return got
            got.extend(j.id for j in jobs)
            await asyncio.sleep(0)

    async def main() -> tuple[list[int], list[int]]:
        async with async_store(db_dsn, max_size=1) as s1, async_store(db_dsn, max_size=1) as s2:
            a, b = await asyncio.gather(claimer(s1, "a"), claimer(s2, "b"))
            return a, b

    a, b = run_async(main)
    assert len(a) == len(set(a)) and len(b) == len(set(b))
    assert not set(a) & set(b)
    assert set(a) | set(b) == all_ids
    with connect(db_dsn) as conn:
        rows = conn.execute(
            "SELECT lease_worker, count(*) AS n FROM deadman.jobs WHERE state = 'running'"
            " GROUP BY lease_worker"
        ).fetchall()
    expected = {w: len(ids) for w, ids in (("a", a), ("b", b)) if ids}
    assert {r["lease_worker"]: r["n"] for r in rows} == expected


def _left(dsn: str) -> ClaimLeft:
    return with_store(dsn, lambda s: s.job_claim_left("default", 5))


def test_what_a_claim_left_says_whether_to_claim_again_or_how_long_to_sleep(
    db_dsn: str,
) -> None:
    """DECISIONS 66: one look after a claim that was not full, instead of the empty
    claim and the next-run-at query that used to follow it."""
    assert _left(db_dsn) == ClaimLeft(more=False, wait_ms=None)
    with connect(db_dsn) as conn:
        for _ in range(3):
            insert_job(conn, run_in_s=-5)
        insert_job(conn, rescues=5, run_in_s=-5)  # quarantined: only claimed alone
    assert _left(db_dsn).more
    assert len(claim(db_dsn, limit=2)) == 2 and _left(db_dsn).more
    assert len(claim(db_dsn, limit=2)) == 1 and _left(db_dsn) == ClaimLeft(False, None)
    with connect(db_dsn) as conn:
        insert_job(conn, state="scheduled", run_in_s=60)
        insert_job(conn, state="retrying", run_in_s=30)
    left = _left(db_dsn)
    assert not left.more  # neither is due
    # the retrying job, not the scheduled one
    assert left.wait_ms is not None and 15_000 < left.wait_ms <= 30_000


def test_a_due_job_another_transaction_holds_is_left_for_the_next_claim(db_dsn: str) -> None:
    """SKIP LOCKED stepped over a due job another transaction holds: the claim is short,
    and what it left says 'more', as the producer's old extra claim would have found."""
    with connect(db_dsn) as conn:
        held = insert_job(conn, run_in_s=-5).id
        free = insert_job(conn, run_in_s=-4).id
    holder = connect(db_dsn, autocommit=False)
    try:
        holder.execute("SELECT 1 FROM deadman.jobs WHERE id = %s FOR UPDATE", (held,))
        assert [j.id for j in claim(db_dsn)] == [free]
        assert _left(db_dsn).more
    finally:
        holder.rollback()
        holder.close()
    assert [j.id for j in claim(db_dsn)] == [held]
    assert not _left(db_dsn).more


# -------------------------------------------------------------------------- finish


def _claim_one(dsn: str, **job: Any) -> Job:
    with connect(dsn) as conn:
        job_id = insert_job(conn, **job).id
    (claimed,) = claim(dsn)
    assert claimed.id == job_id
    return claimed


def test_success_with_the_right_token(db_dsn: str) -> None:
    job = _claim_one(db_dsn)
    done = finish(
        db_dsn,
        Finish(
            job.id, token_of(job), JobState.SUCCEEDED, AttemptOutcome.SUCCEEDED, result={"r": 1}
        ),
    )
    assert done == {job.id}
    with connect(db_dsn) as conn:
        row = job_row(conn, job.id)
        (attempt,) = attempt_rows(conn, job.id)
    assert row["state"] == "succeeded"
    assert row["lease_token"] is None and row["lease_expires_at"] is None
    assert row["finished_at"] is not None and row["result"] == {"r": 1}
    assert attempt["lease_token"] == token_of(job)
    assert attempt["outcome"] == "succeeded" and attempt["attempt"] == 1
    assert attempt["worker"] == "w1" and attempt["error"] is None


def test_failure_with_attempts_left_retries_after_the_delay(db_dsn: str) -> None:
    job = _claim_one(db_dsn)
    with connect(db_dsn) as conn:
        before = db_now(conn)
        finish(
            db_dsn,
            Finish(
                job.id,
                token_of(job),
                JobState.RETRYING,
                AttemptOutcome.FAILED,
                delay_ms=60_000,
                error="boom",
            ),
        )
        row = job_row(conn, job.id)
        (attempt,) = attempt_rows(conn, job.id)
    assert row["state"] == "retrying" and row["finished_at"] is None
    assert row["attempt"] == 1 and row["last_error"] == "boom"
    assert row["run_at"] >= before + timedelta(seconds=60)
    assert (attempt["outcome"], attempt["error"]) == ("failed", "boom")
    assert claim(db_dsn) == []  # not due yet


def test_a_retry_with_no_delay_is_due_at_once(db_dsn: str) -> None:
    job = _claim_one(db_dsn)
    finish(db_dsn, Finish(job.id, token_of(job), JobState.RETRYING, AttemptOutcome.FAILED))
    (again,) = claim(db_dsn)
    assert (again.id, again.attempt) == (job.id, 2)


def test_terminal_outcomes(db_dsn: str) -> None:
    ends = [
        (JobState.DEAD, AttemptOutcome.FAILED),
        (JobState.DEAD, AttemptOutcome.TIMED_OUT),
        (JobState.CANCELLED, AttemptOutcome.CANCELLED),
    ]
    with connect(db_dsn) as conn:
        for _ in ends:
            insert_job(conn)
    jobs = sorted(claim(db_dsn), key=lambda j: j.id)
    finishes = [
        Finish(job.id, token_of(job), state, outcome, error=f"why {n}")
        for n, (job, (state, outcome)) in enumerate(zip(jobs, ends, strict=True))
    ]
    assert finish(db_dsn, *finishes) == {j.id for j in jobs}
    with connect(db_dsn) as conn:
        for f in finishes:
            row = job_row(conn, f.id)
            (attempt,) = attempt_rows(conn, f.id)
            assert row["state"] == f.state.value and row["finished_at"] is not None
            assert row["last_error"] == f.error
            assert attempt["outcome"] == f.outcome.value


def test_released_goes_back_to_queued_without_using_an_attempt(db_dsn: str) -> None:
    job = _claim_one(db_dsn, state="retrying", attempt=2, run_in_s=-1)
    assert job.attempt == 3
    assert finish(
        db_dsn, Finish(job.id, token_of(job), JobState.QUEUED, AttemptOutcome.RELEASED)
    ) == {job.id}
    with connect(db_dsn) as conn:
        row = job_row(conn, job.id)
        (attempt,) = attempt_rows(conn, job.id)
    assert row["state"] == "queued" and row["attempt"] == 2
    assert row["lease_token"] is None and row["finished_at"] is None
    assert (attempt["outcome"], attempt["attempt"]) == ("released", 3)
    (again,) = claim(db_dsn)
    assert again.attempt == 3


def test_a_stale_token_changes_nothing(db_dsn: str) -> None:
    first = _claim_one(db_dsn)
    with connect(db_dsn) as conn:
        expire_lease(conn, first.id, ago_s=10)
        assert rescue(db_dsn) == [first.id]
        (second,) = claim(db_dsn, worker="w2")
        assert token_of(second) != token_of(first)
        row_before = job_row(conn, first.id)
        attempts_before = attempt_rows(conn, first.id)
        zombie = Finish(first.id, token_of(first), JobState.SUCCEEDED, AttemptOutcome.SUCCEEDED)
        assert finish(db_dsn, zombie) == set()
        assert job_row(conn, first.id) == row_before
        assert attempt_rows(conn, first.id) == attempts_before
        assert [a["outcome"] for a in attempts_before] == ["lease_expired"]
        # the current holder still can
        owner = Finish(second.id, token_of(second), JobState.SUCCEEDED, AttemptOutcome.SUCCEEDED)
        assert finish(db_dsn, owner) == {first.id}
        assert job_row(conn, first.id)["state"] == "succeeded"


def test_finishing_twice_writes_once(db_dsn: str) -> None:
    job = _claim_one(db_dsn)
    f = Finish(job.id, token_of(job), JobState.SUCCEEDED, AttemptOutcome.SUCCEEDED)
    assert finish(db_dsn, f) == {job.id}
    assert finish(db_dsn, f) == set()
    with connect(db_dsn) as conn:
        assert len(attempt_rows(conn, job.id)) == 1


def test_a_batch_with_one_stale_finish_writes_the_others(db_dsn: str) -> None:
    with connect(db_dsn) as conn:
        for _ in range(3):
            insert_job(conn)
    a, b, c = sorted(claim(db_dsn), key=lambda j: j.id)
    done = finish(
        db_dsn,
        Finish(a.id, token_of(a), JobState.SUCCEEDED, AttemptOutcome.SUCCEEDED),
        Finish(b.id, token_of(b) + 1000, JobState.SUCCEEDED, AttemptOutcome.SUCCEEDED),
        Finish(c.id, token_of(c), JobState.DEAD, AttemptOutcome.FAILED, error="x"),
    )
    assert done == {a.id, c.id}
    with connect(db_dsn) as conn:
        assert job_row(conn, b.id)["state"] == "running"


def test_finish_of_nothing_is_nothing(db_dsn: str) -> None:
    assert finish(db_dsn) == set()


def test_a_finish_must_be_a_legal_move_from_running() -> None:
    for state in (JobState.WAITING, JobState.SCHEDULED, JobState.RUNNING):
        with pytest.raises(IllegalTransition):
            Finish(1, 1, state, AttemptOutcome.SUCCEEDED)


# ----------------------------------------------------------------------- heartbeat


def test_heartbeat_renews_only_the_current_lease(db_dsn: str) -> None:
    first = _claim_one(db_dsn)
    with connect(db_dsn) as conn:
        expire_lease(conn, first.id)
        rescue(db_dsn)
        (second,) = claim(db_dsn, worker="w1", ttl_ms=10_000)
        before = job_row(conn, first.id)["lease_expires_at"]
        assert heartbeat(db_dsn, [(first.id, token_of(first))]) == {}
        assert job_row(conn, first.id)["lease_expires_at"] == before
        t0 = db_now(conn)
        assert heartbeat(db_dsn, [(second.id, token_of(second))], ttl_ms=60_000) == {
            second.id: False
        }
        after = job_row(conn, first.id)["lease_expires_at"]
    assert after > before
    assert after >= t0 + timedelta(seconds=60)


def test_heartbeat_reports_a_cancel_request(db_dsn: str) -> None:
    with connect(db_dsn) as conn:
        for _ in range(2):
            insert_job(conn)
    a, b = sorted(claim(db_dsn), key=lambda j: j.id)
    with connect(db_dsn) as conn:
        conn.execute("UPDATE deadman.jobs SET cancel_requested = true WHERE id = %s", (b.id,))
    got = heartbeat(db_dsn, [(a.id, token_of(a)), (b.id, token_of(b))])
    assert got == {a.id: False, b.id: True}


def test_heartbeat_registers_and_refreshes_the_worker(db_dsn: str) -> None:
    assert heartbeat(db_dsn, [], worker="w-hb") == {}
    with connect(db_dsn) as conn:
        first = conn.execute("SELECT * FROM deadman.workers WHERE id = 'w-hb'").fetchone()
        assert first is not None
        assert (first["hostname"], first["pid"], first["queues"]) == ("host", 1234, ["default"])
        heartbeat(db_dsn, [], worker="w-hb")
        again = conn.execute("SELECT * FROM deadman.workers WHERE id = 'w-hb'").fetchone()
        assert again is not None
        assert again["last_heartbeat_at"] > first["last_heartbeat_at"]
        assert again["started_at"] == first["started_at"]
        with_store(db_dsn, lambda s: s.worker_deregister("w-hb"))
        assert conn.execute("SELECT count(*) AS n FROM deadman.workers").fetchone() == {"n": 0}


def test_stale_workers_are_pruned(db_dsn: str) -> None:
    heartbeat(db_dsn, [], worker="old")
    heartbeat(db_dsn, [], worker="new")
    with connect(db_dsn) as conn:
        conn.execute(
            "UPDATE deadman.workers SET last_heartbeat_at = now() - interval '10 min'"
            " WHERE id = 'old'"
        )
        with_store(db_dsn, lambda s: s.worker_prune_stale(300_000))
        ids = [r["id"] for r in conn.execute("SELECT id FROM deadman.workers")]
    assert ids == ["new"]


# ------------------------------------------------------------------ the rest of it


def test_async_insert_get_and_attempts(db_dsn: str) -> None:
    async def body(store: AsyncStore) -> None:
        job = await store.job_insert(NewJob("t", {"x": 1}, idempotency_key="k"), 4)
        assert job is not None and job.state is JobState.QUEUED and job.max_attempts == 4
        assert await store.job_insert(NewJob("t", {"x": 1}, idempotency_key="k"), 4) is None
        got = await store.job_get(job.id)
        assert got is not None and got.payload == {"x": 1}
        assert await store.job_get(job.id + 1) is None
        assert [j.id for j in await store.job_get_many([job.id, job.id + 1])] == [job.id]
        assert await store.job_attempts(job.id) == []

    with_store(db_dsn, body)


def test_lease_refusals_are_recorded(db_dsn: str) -> None:
    with_store(db_dsn, lambda s: s.lease_refusal_record("w9", "finish", [(1, 10), (2, 20)]))
    with_store(db_dsn, lambda s: s.lease_refusal_record("w9", "finish", []))
    with connect(db_dsn) as conn:
        rows = conn.execute(
            "SELECT job_id, lease_token, worker, action FROM deadman.lease_refusals ORDER BY id"
        ).fetchall()
    assert [tuple(r.values()) for r in rows] == [(1, 10, "w9", "finish"), (2, 20, "w9", "finish")]


def test_database_errors_become_deadman_errors(db_dsn: str) -> None:
    with pytest.raises(InvalidJob):  # jsonb refuses NaN
        with_store(db_dsn, lambda s: s.job_insert(NewJob("t", float("nan")), 3))


def test_a_nul_in_an_error_text_is_escaped_not_fatal(db_dsn: str) -> None:
    job = _claim_one(db_dsn)
    bad = Finish(job.id, token_of(job), JobState.DEAD, AttemptOutcome.FAILED, error="a\x00b")
    assert finish(db_dsn, bad) == {job.id}
    with psycopg.connect(db_dsn) as conn:
        row = conn.execute("SELECT last_error FROM deadman.jobs WHERE id = %s", [job.id]).fetchone()
    assert row is not None and row[0] == "a\\x00b"


def test_a_program_limit_is_invalid_input_not_a_database_outage(db_dsn: str) -> None:
    """Postgres refuses JSON nested ~50,000 deep with 54001, which psycopg files under
    OperationalError; as DatabaseUnavailable it was retried for ever."""
    from deadman.errors import InvalidJob, translate

    deep = "[" * 60_000 + "]" * 60_000
    with psycopg.connect(db_dsn) as conn, pytest.raises(InvalidJob), translate():
        conn.execute("SELECT %s::jsonb", (deep,))
