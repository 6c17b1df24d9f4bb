"""A real PgBouncer in transaction mode in front of the suite's throwaway cluster
(tests/pgbouncer/bouncer.py starts it: its configuration is described there).

One per session (per pytest-xdist worker: each has its own cluster). Every database
name is routed to the test server, so each test's fresh database is reachable
through it as it is directly: ``bouncer_dsn`` is ``db_dsn`` with PgBouncer's port.
``single_dsn`` is a migrated database of the session served by exactly one server
connection, on which two clients' session state collides deterministically.

Without the binary the tests fail under CI=true and skip, saying why, elsewhere:
the browser test's rule (tests/acceptance/test_dashboard_browser.py).
"""

from __future__ import annotations

import contextlib
import os
import sys
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from tests.acceptance.conftest import (  # noqa: F401  (the acceptance suite's process fixtures)
    _spawner,
    pytest_runtest_makereport,
    spawn_worker,
)
from tests.pgbouncer import bouncer as pgb
from tests.pgbouncer.bouncer import Bouncer


def _missing(reason: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{reason} (CI must have it: `make pgbouncer-deps`)")
    pytest.skip(f"{reason}: run `make pgbouncer-deps`")


@pytest.fixture(scope="session")
def pgbouncer(pg_server_dsn: str, template_db: str) -> Iterator[Bouncer]:
    """The session's pgbouncer, in front of the test server."""
    if pgb.binary() is None:
        _missing(f"{pgb.PGBOUNCER} is not installed")
    single_db = f"deadman_pgbouncer_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_server_dsn, autocommit=True) as admin:
        admin.execute(
            sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                sql.Identifier(single_db), sql.Identifier(template_db)
            )
        )
    try:
        bouncer = pgb.start(pg_server_dsn, single_db)
        try:
            yield bouncer
        finally:
            if not bouncer.stop():
                sys.stderr.write(f"\n----- pgbouncer had died; log -----\n{bouncer.tail()}\n")
    finally:
        with (
            contextlib.suppress(psycopg.Error),
            psycopg.connect(pg_server_dsn, autocommit=True) as admin,
        ):
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(single_db))
            )


@pytest.fixture
def bouncer_dsn(db_dsn: str, pgbouncer: Bouncer) -> str:
    """This test's fresh migrated database, reached through pgbouncer."""
    return pgbouncer.dsn(db_dsn)


@pytest.fixture
def single_dsn(pg_server_dsn: str, pgbouncer: Bouncer) -> str:
    """The session's migrated database behind one server connection (pool_size=1)."""
    assert pgbouncer.single_db is not None
    return pgbouncer.dsn(make_conninfo(pg_server_dsn, dbname=pgbouncer.single_db))


@pytest.fixture
def through_pgbouncer(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process's connections as behind PgBouncer: unprepared, not listening
    (the settings deadman/db/pool.py and the listeners read from the environment)."""
    monkeypatch.setenv("DEADMAN_PREPARE", "off")
    monkeypatch.setenv("DEADMAN_LISTEN", "off")
    monkeypatch.delenv("DEADMAN_LISTEN_URL", raising=False)
