"""conn= with Django (deadman.contrib.django): its PostgreSQL backend on psycopg 3,
inside ``transaction.atomic()``. Committed with the block, the job exists and a real
worker runs it; rolled back, it is gone and no worker was woken; an inner atomic
block (a savepoint) rolled back takes only its own jobs. Outside atomic() there is
nothing to join: refused.

Django is configured here, in-process, for the test's own database (no project)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import django
import psycopg
import pytest
from django.conf import settings
from django.db import connection, connections, transaction
from psycopg.conninfo import conninfo_to_dict

import deadman.contrib.django as deadman_django
from deadman import AsyncClient, Client
from deadman.config import Settings
from deadman.errors import UnsupportedConnection
from tests.acceptance.conftest import _spawner, spawn_worker  # noqa: F401 - fixtures
from tests.factories import run_async
from tests.helpers.processes import SpawnWorker, wait_state
from tests.integration.test_client_conformance import (  # listener_fixture: listener
    heard,
    job_ids,
    listener_fixture,  # noqa: F401
)

if not settings.configured:
    settings.configure(
        DATABASES={"default": {"ENGINE": "django.db.backends.postgresql", "NAME": "unset"}},
        INSTALLED_APPS=[],
        USE_TZ=True,
    )
    django.setup()


@pytest.fixture
def django_db(db_dsn: str) -> Iterator[None]:
    """Django's default database is the test's (each test has its own database)."""
    parts = conninfo_to_dict(db_dsn)
    default = connections["default"]
    default.close()
    default.settings_dict.update(
        NAME=parts["dbname"],
        USER=parts.get("user", ""),
        PASSWORD=parts.get("password", ""),
        HOST=parts.get("host", ""),
        PORT=str(parts.get("port", "")),
    )
    with default.cursor() as cur:
        cur.execute("CREATE TABLE public.orders (id int)")
    try:
        yield
    finally:
        default.close()


@pytest.fixture
def client(db_dsn: str, django_db: None) -> Iterator[Client]:
    with Client(db_dsn, settings=Settings()) as c:
        yield c


def _order(n: int) -> None:
    with connection.cursor() as cur:
        cur.execute("INSERT INTO public.orders VALUES (%s)", [n])


def test_the_job_commits_with_the_atomic_block_and_a_worker_runs_it(
    client: Client,
    db_dsn: str,
    spawn_worker: SpawnWorker,  # noqa: F811
) -> None:
    with transaction.atomic():
        _order(1)
        job = client.enqueue("noop", {"order": 1}, conn=connection)
        assert job_ids(db_dsn) == []  # theirs to commit
    assert job_ids(db_dsn) == [job.id]
    spawn_worker(db_dsn)
    assert wait_state(db_dsn, job.id, "succeeded", timeout=30)["payload"] == {"order": 1}


def test_a_rolled_back_block_takes_the_job_and_wakes_nobody(
    client: Client, db_dsn: str, listener: psycopg.Connection[Any]
) -> None:
    with pytest.raises(RuntimeError, match="app failed"), transaction.atomic():
        _order(1)
        client.enqueue("t", conn=connection)
        client.enqueue_many([client.job("t")], conn=connection)
        raise RuntimeError("app failed")
    assert job_ids(db_dsn) == []
    assert heard(listener, 0.5) == []


def test_an_inner_block_rolled_back_takes_only_its_jobs(client: Client, db_dsn: str) -> None:
    with transaction.atomic():
        before = client.enqueue("t", conn=connection)
        with pytest.raises(RuntimeError, match="app failed"), transaction.atomic():
            client.enqueue("t", conn=connection)
            client.enqueue("t", depends_on=[before.id], conn=connection)
            raise RuntimeError("app failed")
        # another alias's name for the same database: deadman.contrib.django.connection
        after = client.enqueue("t", depends_on=[before.id], conn=deadman_django.connection())
    assert job_ids(db_dsn) == [before.id, after.id]


def test_outside_atomic_there_is_nothing_to_join(client: Client, db_dsn: str) -> None:
    with pytest.raises(UnsupportedConnection, match=r"outside transaction\.atomic\(\)"):
        client.enqueue("t", conn=connection)
    assert client.enqueue("t").id in job_ids(db_dsn)  # without conn=: at once, on its own


def test_the_async_client_refuses_a_django_connection(db_dsn: str, django_db: None) -> None:
    async def main() -> None:
        async with AsyncClient(db_dsn) as aclient:
            with pytest.raises(UnsupportedConnection, match=r"goes to deadman\.Client"):
                await aclient.enqueue("t", conn=connection)

    run_async(main)
    assert job_ids(db_dsn) == []
