"""Shared fixtures: one Postgres server per session, one migrated template database,
and a fresh copy of it for every test (``CREATE DATABASE ... TEMPLATE``: isolated and
much faster than migrating per test), made ahead by a thread, and after the test reset
in place where that provably gives a database as fresh, dropped otherwise
(tests/helpers/database_pool.py, database_reset.py).

Set ``DEADMAN_TEST_DATABASE_URL`` to use an existing server; its database is only used
to create and drop others, so the role needs CREATEDB. ``DEADMAN_TEST_BACKEND=
testcontainers`` starts the server in a container instead (tests/helpers/pg_backend.py).
Otherwise a private fast (fsync off) cluster is started for the session and deleted
at the end.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from deadman import devdb
from tests.helpers import database_pool, database_reset, pg_backend

_SERVER_ENV = "DEADMAN_TEST_DATABASE_URL"


def _admin_execute(server_dsn: str, query: sql.Composed) -> None:
    # CREATE/DROP DATABASE cannot run inside a transaction block.
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        conn.execute(query)


def _create_database(server_dsn: str, name: str, template: str) -> str:
    # Pass template0 for a clean database: template1 on a shared server may carry
    # someone's extensions or tables.
    _admin_execute(server_dsn, database_pool.create_statement(name, template))
    return make_conninfo(server_dsn, dbname=name)


def _drop_database(server_dsn: str, name: str) -> None:
    _admin_execute(server_dsn, database_pool.drop_statement(name))


#: the harness's process runs, started first (DECISIONS 100)
_FIRST = "tests/chaos/test_chaos.py::"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The chaos runs first, in file order; everything else after, in its own order.
    pytest-xdist's worksteal hands each worker one contiguous half of this list and
    then lets an idle worker take the far end of another's: so the chaos runs all go
    to one worker, one after the other, and never run two at once at the end of the
    suite (two at once doubled their times: 88 s for a 11 s one)."""
    items.sort(key=lambda item: not item.nodeid.startswith(_FIRST))


def pytest_configure(config: pytest.Config) -> None:
    # A misspelt backend stops the run before any test, not one error per test.
    try:
        pg_backend.backend()
        pg_backend.image()
    except pg_backend.BackendError as exc:
        raise pytest.UsageError(str(exc)) from exc


@pytest.fixture(scope="session")
def pg_container() -> Iterator[str | None]:
    """DSN of the server in a container (DEADMAN_TEST_BACKEND=testcontainers); None
    for the default local cluster and for DEADMAN_TEST_DATABASE_URL."""
    if os.environ.get(_SERVER_ENV) or pg_backend.backend() != "testcontainers":
        yield None
        return
    with pg_backend.postgres_container(pg_backend.image()) as dsn:
        yield dsn


@pytest.fixture(scope="session")
def pg_cluster(pg_container: str | None) -> Iterator[devdb.Cluster | None]:
    """The session's own cluster, for tests that stop/restart Postgres; None when the
    server comes from DEADMAN_TEST_DATABASE_URL or a container (tests needing it
    should skip)."""
    if os.environ.get(_SERVER_ENV) or pg_container is not None:
        yield None
        return
    cluster = devdb.throwaway()
    try:
        yield cluster
    finally:
        cluster.destroy()


@pytest.fixture(scope="session")
def pg_server_dsn(pg_container: str | None, pg_cluster: devdb.Cluster | None) -> str:
    """DSN of the server's maintenance database; used to CREATE/DROP test databases."""
    external = os.environ.get(_SERVER_ENV) or pg_container
    if external:
        return external
    assert pg_cluster is not None
    return pg_cluster.dsn()


@pytest.fixture(scope="session")
def template_db(pg_server_dsn: str) -> Iterator[str]:
    """Name of a database migrated once per session, copied by ``db_dsn``."""
    # Imported here, not at the top, so tests that need no schema (devdb's own) still
    # run while the migration code is broken or absent.
    from deadman.db.migrate import migrate

    name = database_pool.unique_name("deadman_tpl")
    dsn = _create_database(pg_server_dsn, name, template="template0")
    try:
        migrate(dsn)
        with psycopg.connect(dsn, autocommit=True) as conn:
            database_reset.install_guard(conn)
        # CREATE DATABASE ... TEMPLATE fails while anyone is connected to the template.
        with psycopg.connect(pg_server_dsn, autocommit=True) as conn:
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = %s AND pid <> pg_backend_pid()",
                (name,),
            )
        yield name
    finally:
        _drop_database(pg_server_dsn, name)


@pytest.fixture(scope="session")
def test_databases(pg_server_dsn: str, template_db: str) -> Iterator[database_pool.DatabasePool]:
    """Copies of the template made ahead of the tests that take them (``db_dsn``)."""
    pool = database_pool.DatabasePool(pg_server_dsn, template_db)
    try:
        yield pool
    finally:
        pool.close()


@pytest.fixture
def db_dsn(pg_server_dsn: str, test_databases: database_pool.DatabasePool) -> Iterator[str]:
    """DSN of a fresh, migrated database of this test's own; dropped afterwards."""
    name = test_databases.take()
    try:
        yield make_conninfo(pg_server_dsn, dbname=name)
    finally:
        test_databases.give_back(name)


@pytest.fixture
def empty_db_dsn(pg_server_dsn: str) -> Iterator[str]:
    """DSN of a fresh database with no Deadman schema, for migration tests."""
    name = database_pool.unique_name("test_empty")
    dsn = _create_database(pg_server_dsn, name, template="template0")
    try:
        yield dsn
    finally:
        _drop_database(pg_server_dsn, name)
