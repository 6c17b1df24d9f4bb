"""The worker's two pipelining knobs, against a real database: the completer writes
up to ``in_flight`` batches at once (and never more), and the producer claims at
most ``claim_batch`` jobs per statement, half the slots by default."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import psycopg
import pytest
from psycopg.rows import DictRow

from deadman.client import Client
from deadman.model import AttemptOutcome, Job, JobState
from deadman.store import AsyncStore, ClaimParams, Finish
from deadman.worker.completer import Completer
from tests.factories import connect, run_async
from tests.helpers import wait_for
from tests.helpers.worker import SETTINGS, running_worker


class WatchedStore(AsyncStore):
    """The real store, counting how many finish statements run at once and how many
    jobs each claim asked for. Each finish waits a little first, so that overlapping
    flushes really overlap."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.running = 0
        self.most_at_once = 0
        self.batches: list[int] = []
        self.claim_limits: list[int] = []
        self.refills = 0

    async def job_finish_many(self, finishes: Sequence[Finish]) -> set[int]:
        self.running += 1
        self.most_at_once = max(self.most_at_once, self.running)
        self.batches.append(len(finishes))
        try:
            await asyncio.sleep(0.05)
            return await super().job_finish_many(finishes)
        finally:
            self.running -= 1

    async def job_claim(self, p: ClaimParams, retry_s: float | None = None) -> list[Job]:
        self.claim_limits.append(p.limit)
        return await super().job_claim(p, retry_s)

    async def job_finish_claim(
        self, finishes: Sequence[Finish], claim: ClaimParams
    ) -> tuple[set[int], list[Job]]:
        """The completer's refill: a finish and a claim in one transaction."""
        self.claim_limits.append(claim.limit)
        self.refills += 1
        self.running += 1
        self.most_at_once = max(self.most_at_once, self.running)
        self.batches.append(len(finishes))
        try:
            await asyncio.sleep(0.05)
            return await super().job_finish_claim(finishes, claim)
        finally:
            self.running -= 1


def claimed(conn: psycopg.Connection[DictRow], n: int) -> list[tuple[int, int]]:
    rows = conn.execute(
        "UPDATE deadman.jobs SET state = 'running', attempt = 1, lease_worker = 'w',"
        " lease_token = nextval('deadman.lease_token_seq'), started_at = now(),"
        " lease_expires_at = now() + interval '1 minute'"
        " WHERE id IN (SELECT id FROM deadman.jobs ORDER BY id LIMIT %s)"
        " RETURNING id, lease_token",
        (n,),
    ).fetchall()
    return [(int(r["id"]), int(r["lease_token"])) for r in rows]


@pytest.mark.parametrize("in_flight", [1, 2, 3])
def test_the_completer_writes_at_most_in_flight_batches_at_once(
    db_dsn: str, in_flight: int
) -> None:
    with Client(db_dsn) as client, connect(db_dsn) as conn:
        client.enqueue_many([client.job("noop") for _ in range(40)])
        leases = claimed(conn, 40)

        async def main() -> tuple[list[bool], WatchedStore]:
            store = WatchedStore.create(db_dsn, min_size=1, max_size=6, retry_s=0.0)
            await store.open(wait=True, timeout=10.0)
            try:
                completer = Completer(store, "w", batch_max=5, in_flight=in_flight)
                runner = asyncio.create_task(completer.run())
                results = await asyncio.gather(
                    *(
                        completer.submit(
                            Finish(i, t, JobState.SUCCEEDED, AttemptOutcome.SUCCEEDED),
                            "default",
                        )
                        for i, t in leases
                    )
                )
                completer.stop()
                await asyncio.wait_for(runner, 10)
                return results, store
            finally:
                await store.close()

        results, store = run_async(main)
        assert results == [True] * 40
        assert store.most_at_once == in_flight
        assert max(store.batches) <= 5 and sum(store.batches) == 40
        row = conn.execute(
            "SELECT count(*) FILTER (WHERE state = 'succeeded') AS ok,"
            " (SELECT count(*) FROM deadman.attempts) AS attempts FROM deadman.jobs"
        ).fetchone()
        assert row == {"ok": 40, "attempts": 40}


def test_a_flush_that_raises_fails_its_rows_not_the_completer(db_dsn: str) -> None:
    """A bug in a flush must not vanish into an unawaited task, nor end the task: the
    submitter gets the error (the executor then fails the attempt), and the completer
    keeps running for every other outcome."""

    class Broken(AsyncStore):
        async def job_finish_many(self, finishes: Sequence[Finish]) -> set[int]:
            raise RuntimeError("boom")

    async def main() -> None:
        store = Broken.create(db_dsn, min_size=1, max_size=2, retry_s=0.0)
        await store.open(wait=True, timeout=10.0)
        try:
            completer = Completer(store, "w")
            runner = asyncio.create_task(completer.run())
            finish = Finish(1, 1, JobState.SUCCEEDED, AttemptOutcome.SUCCEEDED)
            with pytest.raises(RuntimeError, match="boom"):
                await asyncio.wait_for(completer.submit(finish, "q"), 10)
            assert not runner.done()
            completer.stop()
            await asyncio.wait_for(runner, 10)
        finally:
            await store.close()

    run_async(main)


def test_a_callback_that_raises_is_told_alone(db_dsn: str) -> None:
    """Completer.post (DECISIONS 102): each outcome's callback is told how it ended,
    from the flush; one that raises (a bug on its side) is logged, and the outcomes
    batched with it are written and told all the same, the completer running on."""

    async def main() -> None:
        store = AsyncStore.create(db_dsn, min_size=1, max_size=2, retry_s=0.0)
        await store.open(wait=True, timeout=10.0)
        try:
            completer = Completer(store, "w", in_flight=1)
            told: list[tuple[int, bool, BaseException | None]] = []
            all_told = asyncio.Event()

            def tell(i: int) -> Callable[[bool, BaseException | None], None]:
                def written(ok: bool, error: BaseException | None) -> None:
                    told.append((i, ok, error))
                    if len(told) == 3:
                        all_told.set()
                    if i == 1:
                        raise RuntimeError("a bug in the callback")

                return written

            for i in range(3):  # no such jobs: the fence refuses all three
                finish = Finish(10_000 + i, 1, JobState.SUCCEEDED, AttemptOutcome.SUCCEEDED)
                completer.post(finish, "q", tell(i))
            runner = asyncio.create_task(completer.run())
            await asyncio.wait_for(all_told.wait(), 10)
            assert sorted(told, key=lambda t: t[0]) == [
                (0, False, None),
                (1, False, None),
                (2, False, None),
            ]
            assert not runner.done()
            assert await asyncio.wait_for(completer.submit(finish, "q"), 10) is False
            completer.stop()
            await asyncio.wait_for(runner, 10)
        finally:
            await store.close()

    run_async(main)


@pytest.mark.parametrize(("claim_batch", "most"), [(0, 4), (3, 3)])
def test_the_producer_claims_at_most_claim_batch_per_statement(
    db_dsn: str, claim_batch: int, most: int
) -> None:
    """8 slots: by default a claim asks for 4 at most (half), so two cohorts
    alternate; DEADMAN_CLAIM_BATCH sets it. Every job still runs exactly once."""
    store = WatchedStore.create(db_dsn, min_size=2, max_size=6)
    settings = replace(SETTINGS, concurrency=8, claim_batch=claim_batch)
    with Client(db_dsn, settings=settings) as client, connect(db_dsn) as conn:
        ids = client.enqueue_many([client.job("t.async") for _ in range(60)])
        with running_worker(db_dsn, settings=settings, store=store):
            wait_for(
                lambda: (
                    conn.execute(
                        "SELECT count(*) AS n FROM deadman.jobs WHERE state = 'succeeded'"
                    ).fetchone()
                    == {"n": 60}
                ),
                timeout=20,
                message="60 jobs succeeded",
            )
        limits = store.claim_limits
        assert limits and max(limits) == most
        assert store.refills  # most claims rode on a completion (DECISIONS 45)
        rows = conn.execute(
            "SELECT job_id, count(*) AS n FROM deadman.attempts WHERE job_id = ANY(%s)"
            " GROUP BY job_id",
            (ids,),
        ).fetchall()
        assert len(rows) == 60 and {r["n"] for r in rows} == {1}
