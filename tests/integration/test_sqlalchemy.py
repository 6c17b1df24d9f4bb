"""conn= with SQLAlchemy 2.x on the psycopg driver: a sync Connection or Session for
deadman.Client, an AsyncConnection or AsyncSession for deadman.AsyncClient. The job
is written in the caller's current transaction (and savepoint): committed, it exists
and a real worker runs it; rolled back, it is gone and no worker was woken; a
savepoint rolled back takes only its own jobs. Other drivers and other databases
are refused."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, create_async_engine
from sqlalchemy.orm import Session

from deadman import AsyncClient, Client
from deadman.config import Settings
from deadman.errors import UnsupportedConnection
from tests.acceptance.conftest import _spawner, spawn_worker  # noqa: F401 - fixtures
from tests.factories import connect, run_async
from tests.helpers.processes import SpawnWorker, wait_state
from tests.integration.test_client_conformance import (  # listener_fixture: listener
    heard,
    job_ids,
    listener_fixture,  # noqa: F401
)


def url(dsn: str) -> URL:
    """The libpq dsn as a SQLAlchemy URL on the psycopg driver."""
    parts = conninfo_to_dict(dsn)
    return URL.create(
        "postgresql+psycopg",
        username=str(parts.get("user") or "") or None,
        password=str(parts.get("password") or "") or None,
        host=str(parts.get("host") or "") or None,
        port=int(str(parts["port"])) if parts.get("port") else None,
        database=str(parts["dbname"]),
    )


@pytest.fixture
def engine(db_dsn: str) -> Iterator[Engine]:
    made = create_engine(url(db_dsn))
    with made.begin() as conn:
        conn.execute(text("CREATE TABLE public.orders (id int)"))
    yield made
    made.dispose()


@pytest.fixture
def client(db_dsn: str) -> Iterator[Client]:
    with Client(db_dsn, settings=Settings()) as c:
        yield c


def _orders(dsn: str) -> int:
    with connect(dsn) as conn:
        row = conn.execute("SELECT count(*) AS n FROM public.orders").fetchone()
    assert row is not None
    return int(row["n"])


# -- sync ----------------------------------------------------------------------------


def test_a_connections_commit_takes_the_job_and_a_worker_runs_it(
    engine: Engine,
    client: Client,
    db_dsn: str,
    spawn_worker: SpawnWorker,  # noqa: F811
) -> None:
    with engine.connect() as conn:
        conn.execute(text("INSERT INTO public.orders VALUES (1)"))
        job = client.enqueue("noop", {"order": 1}, conn=conn)
        assert job_ids(db_dsn) == []
        conn.commit()
    assert _orders(db_dsn) == 1
    spawn_worker(db_dsn)
    assert wait_state(db_dsn, job.id, "succeeded", timeout=30)["payload"] == {"order": 1}


def test_a_connections_rollback_takes_the_job_and_wakes_nobody(
    engine: Engine, client: Client, db_dsn: str, listener: psycopg.Connection[Any]
) -> None:
    with engine.connect() as conn:
        conn.execute(text("INSERT INTO public.orders VALUES (1)"))
        client.enqueue("t", conn=conn)
        client.enqueue_many([client.job("t"), client.job("t")], conn=conn)
        conn.rollback()
    assert (job_ids(db_dsn), _orders(db_dsn)) == ([], 0)
    assert heard(listener, 0.5) == []


def test_the_first_statement_begins_their_transaction(
    engine: Engine, client: Client, db_dsn: str
) -> None:
    """An enqueue before any statement of theirs begins SQLAlchemy's transaction, as
    their own execute would: their commit commits it, their close rolls it back."""
    with engine.connect() as conn:
        committed = client.enqueue("t", conn=conn)
        assert conn.in_transaction()
        conn.commit()
    with engine.connect() as conn:
        client.enqueue("t", conn=conn)  # closed without commit
    assert job_ids(db_dsn) == [committed.id]


def test_a_rolled_back_savepoint_takes_only_its_jobs(
    engine: Engine, client: Client, db_dsn: str
) -> None:
    with engine.begin() as conn:
        before = client.enqueue("t", conn=conn)
        savepoint = conn.begin_nested()
        client.enqueue("t", conn=conn)
        client.enqueue("t", depends_on=[before.id], conn=conn)
        savepoint.rollback()
        after = client.enqueue("t", depends_on=[before.id], conn=conn)
    assert job_ids(db_dsn) == [before.id, after.id]


def test_a_session(engine: Engine, client: Client, db_dsn: str) -> None:
    with Session(engine) as session:
        session.execute(text("INSERT INTO public.orders VALUES (1)"))
        kept = client.enqueue("t", conn=session)
        with pytest.raises(RuntimeError, match="app failed"), session.begin_nested():
            client.enqueue("t", conn=session)
            raise RuntimeError("app failed")
        wf = client.workflow("w", {"a": client.job("a")}, conn=session)
        session.commit()
    with Session(engine) as session:
        client.enqueue("t", conn=session)
        session.rollback()
    assert job_ids(db_dsn) == [kept.id, wf.nodes["a"].id]
    assert _orders(db_dsn) == 1


def test_another_driver_or_database_is_refused(
    client: Client, pg_server_dsn: str, db_dsn: str
) -> None:
    sqlite = create_engine("sqlite://")
    with sqlite.connect() as conn, pytest.raises(UnsupportedConnection, match="sqlite"):
        client.enqueue("t", conn=conn)
    sqlite.dispose()
    elsewhere = create_engine(url(pg_server_dsn))
    with elsewhere.connect() as conn, pytest.raises(UnsupportedConnection, match="database"):
        client.enqueue("t", conn=conn)
    elsewhere.dispose()
    assert job_ids(db_dsn) == []


# -- async ---------------------------------------------------------------------------


@asynccontextmanager
async def async_engine(dsn: str) -> AsyncIterator[AsyncEngine]:
    made = create_async_engine(url(dsn))
    try:
        yield made
    finally:
        await made.dispose()


def test_an_async_connections_commit_and_a_worker_runs_it(
    engine: Engine,
    db_dsn: str,
    spawn_worker: SpawnWorker,  # noqa: F811
) -> None:
    async def main() -> int:
        async with async_engine(db_dsn) as aengine, AsyncClient(db_dsn) as aclient:
            async with aengine.connect() as conn:
                await conn.execute(text("INSERT INTO public.orders VALUES (1)"))
                job = await aclient.enqueue("noop", {"order": 1}, conn=conn)
                assert job_ids(db_dsn) == []
                await conn.commit()
            async with aengine.connect() as conn:
                await aclient.enqueue("t", conn=conn)
                await conn.rollback()
            return job.id

    job_id = run_async(main)
    assert job_ids(db_dsn) == [job_id]
    spawn_worker(db_dsn)
    assert wait_state(db_dsn, job_id, "succeeded", timeout=30)["payload"] == {"order": 1}


def test_an_async_session_rollback_savepoint_and_commit(
    engine: Engine, db_dsn: str, listener: psycopg.Connection[Any]
) -> None:
    async def main() -> list[int]:
        async with async_engine(db_dsn) as aengine, AsyncClient(db_dsn) as aclient:
            async with AsyncSession(aengine) as session:
                await aclient.enqueue("t", conn=session)
                await session.rollback()
                assert heard(listener, 0.5) == []  # rolled back: no worker woken
                kept = await aclient.enqueue("t", conn=session)
                with pytest.raises(RuntimeError, match="app failed"):
                    async with session.begin_nested():
                        await aclient.enqueue("t", conn=session)
                        raise RuntimeError("app failed")
                many = await aclient.enqueue_many([aclient.job("t")], conn=session)
                await session.commit()
            return [kept.id, *many]

    kept = run_async(main)
    assert job_ids(db_dsn) == kept
    assert heard(listener, 5) == ["default"]


def test_the_wrong_kind_for_the_client_is_refused(engine: Engine, db_dsn: str) -> None:
    async def main() -> None:
        async with async_engine(db_dsn) as aengine, AsyncClient(db_dsn) as aclient:
            with (
                engine.connect() as sync_conn,
                pytest.raises(UnsupportedConnection, match=r"^AsyncClient cannot join"),
            ):
                await aclient.enqueue("t", conn=sync_conn)
            async with AsyncSession(aengine) as session:
                with (
                    Client(db_dsn) as client,
                    pytest.raises(UnsupportedConnection, match=r"^Client cannot join"),
                ):
                    client.enqueue("t", conn=session)

    run_async(main)
    assert job_ids(db_dsn) == []
