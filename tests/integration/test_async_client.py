"""deadman.AsyncClient against a real database and a real worker: its own pool (made
once, lazily, by concurrent first calls), the caller's AsyncConnection (commit,
rollback, savepoint; the NOTIFY only with the commit), and many tasks at once.

The calls themselves are checked against the sync client's in
test_client_conformance.py; this is what is particular to running on a loop."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

from deadman import AsyncClient
from deadman.config import Settings
from deadman.db.pool import async_pool as pool_factory
from deadman.model import JobState
from tests.acceptance.conftest import _spawner, spawn_worker  # noqa: F401 - fixtures
from tests.factories import run_async
from tests.helpers.processes import SpawnWorker, wait_state
from tests.integration.test_client_conformance import (  # listener_fixture: listener
    heard,
    job_ids,
    listener_fixture,  # noqa: F401
)


def test_a_job_it_enqueues_is_run_by_a_worker(db_dsn: str, spawn_worker: SpawnWorker) -> None:  # noqa: F811
    async def main() -> int:
        async with AsyncClient(db_dsn) as aclient:
            return (await aclient.enqueue("noop", {"from": "asyncio"})).id

    job_id = run_async(main)
    spawn_worker(db_dsn)
    assert wait_state(db_dsn, job_id, "succeeded", timeout=30)["payload"] == {"from": "asyncio"}


def test_the_callers_transaction_decides(db_dsn: str, listener: psycopg.Connection[Any]) -> None:
    async def main() -> tuple[int, int]:
        async with AsyncClient(db_dsn) as aclient:
            mine = await psycopg.AsyncConnection.connect(db_dsn)
            async with mine:
                await mine.execute("CREATE TABLE public.orders (id int)")
                await mine.execute("INSERT INTO public.orders VALUES (1)")
                gone = await aclient.enqueue("t", conn=mine)
                assert job_ids(db_dsn) == []  # invisible outside until they commit
                await mine.rollback()
                assert heard(listener, 0.5) == []  # a rolled-back job wakes nobody
                kept = await aclient.enqueue("t", conn=mine)
                await mine.commit()
            return gone.id, kept.id

    gone, kept = run_async(main)
    assert job_ids(db_dsn) == [kept] and gone != kept
    assert heard(listener, 5) == ["default"]  # the commit delivers the wake-up


def test_a_rolled_back_savepoint_takes_only_its_jobs(db_dsn: str) -> None:
    async def main() -> tuple[int, int]:
        async with AsyncClient(db_dsn) as aclient:
            mine = await psycopg.AsyncConnection.connect(db_dsn, autocommit=True)
            async with mine, mine.transaction():
                before = await aclient.enqueue("t", conn=mine)
                with pytest.raises(RuntimeError, match="app failed"):
                    async with mine.transaction():  # a savepoint
                        await aclient.enqueue("t", conn=mine)
                        await aclient.enqueue_many(
                            [aclient.job("t"), aclient.job("t", depends_on=[before.id])],
                            conn=mine,
                        )
                        raise RuntimeError("app failed")
                after = await aclient.enqueue("t", depends_on=[before.id], conn=mine)
            return before.id, after.id

    kept = list(run_async(main))
    assert job_ids(db_dsn) == kept


def test_many_tasks_at_once_share_the_pool_and_one_key_makes_one_job(
    db_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    made: list[AsyncConnectionPool[Any]] = []

    def counting(*args: Any, **kwargs: Any) -> AsyncConnectionPool[Any]:
        pool = pool_factory(*args, **kwargs)
        made.append(pool)
        return pool

    monkeypatch.setattr("deadman.aclient.async_pool", counting)

    async def main() -> list[int]:
        async with AsyncClient(db_dsn, settings=Settings()) as aclient:
            jobs = await asyncio.gather(
                *(aclient.enqueue("t", {"same": True}, idempotency_key="race") for _ in range(20))
            )
            return [j.id for j in jobs]

    ids = run_async(main)
    assert len(made) == 1  # twenty first calls, one pool
    assert len(set(ids)) == 1 and job_ids(db_dsn) == ids[:1]


def test_close_then_use_again_opens_a_new_pool(db_dsn: str) -> None:
    async def main() -> None:
        aclient = AsyncClient(db_dsn)
        first = await aclient.enqueue("t")
        await aclient.close()
        assert aclient._pool is None
        got = await aclient.get(first.id)
        assert got is not None and got.state is JobState.QUEUED
        await aclient.close()
        await aclient.close()  # twice is harmless

    run_async(main)
