"""The suite's own pool of test databases (tests/helpers/database_pool.py): every test
that takes ``db_dsn`` stands on it, so it is tried here against what the suite does
to Postgres: restarts, a server that never answers, and databases left connected."""

from __future__ import annotations

import socket

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from deadman.devdb import Cluster
from tests.factories import insert_job
from tests.helpers import wait_for
from tests.helpers.database_pool import DatabasePool, PoolStopped
from tests.helpers.database_reset import GUARD_SCHEMA

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


def _on_server(server_dsn: str, statement: str) -> None:
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        conn.execute(statement.encode())


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
        _on_server(pg_server_dsn, f'CREATE DATABASE "{late}" TEMPLATE "{template_db}"')
        taken = pool.take(timeout=30)
        assert _has_schema(pg_server_dsn, taken)
        pool.give_back(taken)
    finally:
        pool.close()
        _on_server(pg_server_dsn, f'DROP DATABASE IF EXISTS "{late}"')
    assert _databases(pg_server_dsn) == set()


# ------------------------------------------------------------------ reuse (DECISIONS 98)

#: what a test can see of a database's state, beyond its schema
_FINGERPRINT = """
SELECT c.oid::regclass::text, c.relkind, pg_relation_size(c.oid), c.relpages, c.reltuples,
       (SELECT count(*) FROM pg_statistic s WHERE s.starelid = c.oid),
       s.n_tup_ins, s.n_tup_upd, s.n_tup_del, s.n_live_tup, s.n_dead_tup,
       s.seq_scan, s.idx_scan, s.vacuum_count, s.analyze_count
FROM pg_class c
JOIN pg_namespace n ON n.oid = c.relnamespace
LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid
WHERE n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg\\_%'
  AND c.relkind IN ('r', 'i', 'S', 't')
ORDER BY 1
"""


def _fingerprint(server_dsn: str, name: str) -> list[tuple[object, ...]]:
    with psycopg.connect(make_conninfo(server_dsn, dbname=name), autocommit=True) as conn:
        rows = conn.execute(_FINGERPRINT).fetchall()
        sequences = conn.execute(
            "SELECT schemaname, sequencename, last_value FROM pg_sequences ORDER BY 1, 2"
        ).fetchall()
    return [*rows, *sequences]


def _use_hard(dsn: str) -> None:
    """What tests do to their databases: rows in several tables (a job through a
    claim and a finish, with its attempts), sequences moved, ANALYZE, VACUUM."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for state in ("queued", "running", "succeeded", "dead", "running"):
            insert_job(conn, state=state)
        conn.execute("INSERT INTO deadman.limits (key, concurrency) VALUES ('pool-test', 3)")
        conn.execute("DELETE FROM deadman.jobs WHERE state = 'dead'")
        conn.execute("ANALYZE deadman.jobs")
        conn.execute("VACUUM deadman.limits")
        conn.execute("SELECT nextval('deadman.lease_token_seq')")
        conn.execute("SELECT pg_stat_force_next_flush()")


def _handed_out_again(pool: DatabasePool, given: int, within: float = 30.0) -> None:
    wait_for(
        lambda: len(pool.reused) + pool.dropped >= given,
        within,
        interval=0.01,
        message=f"{given} databases given back to be reused or dropped",
    )


def test_a_database_given_back_is_handed_out_again_as_a_fresh_copy_would_be(
    pg_server_dsn: str, template_db: str
) -> None:
    fresh = f"{PREFIX}_fresh"
    _on_server(pg_server_dsn, f'CREATE DATABASE "{fresh}" TEMPLATE "{template_db}"')
    pool = DatabasePool(pg_server_dsn, template_db, ahead=1, prefix=PREFIX)
    try:
        want = _fingerprint(pg_server_dsn, fresh)
        name = pool.take(timeout=30)
        _use_hard(make_conninfo(pg_server_dsn, dbname=name))
        # a session left open, and one that comes back with the old name later
        leaked = psycopg.connect(make_conninfo(pg_server_dsn, dbname=name))
        assert _fingerprint(pg_server_dsn, name) != want  # the check can fail
        pool.give_back(name)
        _handed_out_again(pool, 1)
        assert (len(pool.reused), pool.dropped) == (1, 0)
        with pytest.raises(psycopg.OperationalError):
            leaked.execute("SELECT 1")
        leaked.close()
        with pytest.raises(psycopg.OperationalError, match="does not exist"):
            psycopg.connect(make_conninfo(pg_server_dsn, dbname=name)).close()
        taken = [pool.take(timeout=30)]
        if taken[0] != pool.reused[0]:  # a copy made ahead came first
            taken.append(pool.take(timeout=30))
        assert taken[-1] == pool.reused[0]
        assert _fingerprint(pg_server_dsn, taken[-1]) == want
        for again in taken:
            pool.give_back(again)
    finally:
        pool.close()
        _on_server(pg_server_dsn, f'DROP DATABASE IF EXISTS "{fresh}"')
    assert _databases(pg_server_dsn) == set()


#: (what a test did, SQL on its database or, with {db}, on the server; reused?)
CHANGES = [
    ("a table created", "CREATE TABLE public.scratch (x int)", False),
    ("a trigger disabled", "ALTER TABLE deadman.jobs DISABLE TRIGGER USER", False),
    ("a function replaced", "CREATE OR REPLACE FUNCTION public.f() RETURNS int"
     " LANGUAGE sql AS 'SELECT 1'", False),
    ("a table's setting", "ALTER TABLE deadman.jobs SET (fillfactor = 50)", False),
    ("a row the template wrote", "DELETE FROM deadman.schema_migrations"
     " WHERE version = (SELECT max(version) FROM deadman.schema_migrations)", False),
    ("a database setting", 'ALTER DATABASE "{db}" SET work_mem = \'1MB\'', False),
    ("a connection limit", 'ALTER DATABASE "{db}" CONNECTION LIMIT 5', False),
    ("connections refused", 'ALTER DATABASE "{db}" ALLOW_CONNECTIONS false', False),
    ("DDL rolled back", "BEGIN; CREATE TABLE public.scratch (x int); ROLLBACK", True),
    ("rows only", "INSERT INTO deadman.queues (name, paused) VALUES ('q', true)", True),
]  # fmt: skip


@pytest.mark.parametrize(("change", "statement", "reused"), CHANGES, ids=[c[0] for c in CHANGES])
def test_a_database_changed_beyond_its_rows_is_dropped_not_handed_out_again(
    pg_server_dsn: str, template_db: str, change: str, statement: str, reused: bool
) -> None:
    pool = DatabasePool(pg_server_dsn, template_db, ahead=1, prefix=PREFIX)
    try:
        name = pool.take(timeout=30)
        on_server = "{db}" in statement
        target = pg_server_dsn if on_server else make_conninfo(pg_server_dsn, dbname=name)
        with psycopg.connect(target, autocommit=True) as conn:
            conn.execute(statement.replace("{db}", name).encode())
        pool.give_back(name)
        _handed_out_again(pool, 1)
        assert (len(pool.reused), pool.dropped) == ((1, 0) if reused else (0, 1)), change
        assert name not in _databases(pg_server_dsn)
    finally:
        pool.close()
    assert _databases(pg_server_dsn) == set()


def test_without_the_ddl_guard_every_database_given_back_is_dropped(
    pg_server_dsn: str, template_db: str
) -> None:
    """A template without the guard (a server where we may not create event
    triggers): nothing could prove a database unchanged, so none is reused."""
    bare = f"{PREFIX}_bare_template"
    _on_server(pg_server_dsn, f'CREATE DATABASE "{bare}" TEMPLATE "{template_db}"')
    with psycopg.connect(make_conninfo(pg_server_dsn, dbname=bare), autocommit=True) as conn:
        conn.execute(f"DROP EVENT TRIGGER {GUARD_SCHEMA}_ddl")
        conn.execute(f"DROP SCHEMA {GUARD_SCHEMA} CASCADE")
    pool = DatabasePool(pg_server_dsn, bare, ahead=1, prefix=PREFIX)
    try:
        taken = [pool.take(timeout=30) for _ in range(3)]
        for name in taken:
            pool.give_back(name)
        _handed_out_again(pool, 3)
        assert (pool.reused, pool.dropped) == ([], 3)
        assert not set(taken) & _databases(pg_server_dsn)
    finally:
        pool.close()
        _on_server(pg_server_dsn, f'DROP DATABASE IF EXISTS "{bare}"')
    assert _databases(pg_server_dsn) == set()
