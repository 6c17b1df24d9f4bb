"""The suite's own pool of test databases (tests/helpers/database_pool.py): every test
that takes ``db_dsn`` stands on it, so it is tried here against what the suite does
to Postgres: restarts, a server that never answers, and databases left connected."""

from __future__ import annotations

import socket

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from deadman.devdb import Cluster
from tests.helpers import wait_for
from tests.helpers.database_pool import DatabasePool, PoolStopped

#: this module's pools name their databases so; the suite's own pool works alongside
PREFIX = "pooltest"


def _databases(server_dsn: str) -> set[str]:
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT datname FROM pg_database WHERE datname LIKE %s", (PREFIX + "\\_%",)
        ).fetchall()
    return {str(row[0]) for row in rows}


def _wait_gone(server_dsn: str, names: set[str], within: float = 30.0) -> None:
    wait_for(
        lambda: not names & _databases(server_dsn),
        within,
        interval=0.05,
        message=f"databases {sorted(names)} to be dropped",
    )


def _has_schema(server_dsn: str, name: str) -> bool:
    with psycopg.connect(make_conninfo(server_dsn, dbname=name)) as conn:
        row = conn.execute("SELECT to_regclass('deadman.jobs') IS NOT NULL").fetchone()
    return bool(row and row[0])


def test_takes_are_distinct_migrated_copies_dropped_when_given_back(
    pg_server_dsn: str, template_db: str
) -> None:
    pool = DatabasePool(pg_server_dsn, template_db, ahead=2, prefix=PREFIX)
    try:
        taken = [pool.take(timeout=30) for _ in range(5)]
        assert len(set(taken)) == 5
        assert set(taken) <= _databases(pg_server_dsn)
        assert all(_has_schema(pg_server_dsn, name) for name in taken)
        # A test that leaves a connection open still gets its database dropped.
        leaked = psycopg.connect(make_conninfo(pg_server_dsn, dbname=taken[0]))
        for name in taken:
            pool.give_back(name)
        _wait_gone(pg_server_dsn, set(taken))
        with pytest.raises(psycopg.OperationalError):
            leaked.execute("SELECT 1")
        leaked.close()
    finally:
        pool.close()
    # The copies made ahead and never taken are gone too.
    assert _databases(pg_server_dsn) == set()


def test_a_postgres_restart_costs_the_pool_nothing(
    pg_cluster: Cluster | None, pg_server_dsn: str, template_db: str
) -> None:
    if pg_cluster is None:
        # a server given by DEADMAN_TEST_DATABASE_URL (or a container) is not ours to
        # restart; make test always runs this on its own cluster
        pytest.skip(
            "restarts Postgres, so it runs only on the suite's own cluster, not on a"
            " server DEADMAN_TEST_DATABASE_URL names or a testcontainers one"
        )
    pool = DatabasePool(pg_server_dsn, template_db, ahead=2, prefix=PREFIX)
    try:
        first = pool.take(timeout=30)
        pool.give_back(pool.take(timeout=30))
        pg_cluster.restart(mode="immediate")
        after = [pool.take(timeout=60) for _ in range(3)]
        assert first not in after and len(set(after)) == 3
        assert all(_has_schema(pg_server_dsn, name) for name in [first, *after])
        for name in [first, *after]:
            pool.give_back(name)
    finally:
        pool.close()
    assert _databases(pg_server_dsn) == set()


def test_a_server_that_never_answers_stops_the_pool_with_its_error() -> None:
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    # Nothing listens on the port now: every connection is refused.
    pool = DatabasePool(
        f"host=127.0.0.1 port={port} dbname=postgres connect_timeout=2",
        "no_such_template",
        give_up_after=0.5,
    )
    try:
        with pytest.raises(PoolStopped) as caught:
            pool.take(timeout=30)
        assert isinstance(caught.value.__cause__, psycopg.OperationalError)
    finally:
        # No statement reached a server, so there is nothing to drop.
        pool.close()


def test_a_template_that_cannot_be_copied_stops_the_pool(
    pg_server_dsn: str,
) -> None:
    pool = DatabasePool(pg_server_dsn, "no_such_template", give_up_after=0.5)
    try:
        with pytest.raises(PoolStopped) as caught:
            pool.take(timeout=30)
        assert isinstance(caught.value.__cause__, psycopg.errors.InvalidCatalogName)
    finally:
        pool.close()


def test_a_template_that_appears_late_is_copied_and_no_try_is_leaked(
    pg_server_dsn: str, template_db: str
) -> None:
    late = f"{PREFIX}_late_template"
    pool = DatabasePool(pg_server_dsn, late, give_up_after=30, prefix=PREFIX)
    try:
        # The pool's first tries fail (no such template) and are retried under new
        # names; the template then appears.
        with psycopg.connect(pg_server_dsn, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{late}" TEMPLATE "{template_db}"')
        taken = pool.take(timeout=30)
        assert _has_schema(pg_server_dsn, taken)
        pool.give_back(taken)
    finally:
        pool.close()
        with psycopg.connect(pg_server_dsn, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{late}"')
    assert _databases(pg_server_dsn) == set()
