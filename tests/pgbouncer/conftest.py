"""A real PgBouncer in transaction mode in front of the suite's throwaway cluster.

Debian's ``pgbouncer`` (``make pgbouncer-deps``), started once per session (per
pytest-xdist worker: each has its own cluster) on a free 127.0.0.1 port, in the
foreground so that teardown stops exactly the process it started. Clients are
trusted (``auth_type = trust``; the user must still be in the auth file), and the
server login is the test server's own. Every database name is routed to the test
server (``* =``), so each test's fresh database is reachable through it as it is
directly: ``bouncer_dsn`` is ``db_dsn`` with PgBouncer's port.

``server_round_robin = 1``: consecutive transactions of one client land on different
server connections as often as PgBouncer can make them, which is what a busy
production pooler does and what would expose session state that leaked from one
transaction into the next. ``single_dsn`` is a migrated database of the session
served by exactly one server connection (``pool_size=1``), on which two clients'
session state collides deterministically.

Without the binary the tests fail under CI=true and skip, saying why, elsewhere:
the browser test's rule (tests/acceptance/test_dashboard_browser.py).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from deadman.devdb_os import as_postgres, postgres_user
from tests.acceptance.conftest import (  # noqa: F401  (the acceptance suite's process fixtures)
    _spawner,
    pytest_runtest_makereport,
    spawn_worker,
)
from tests.helpers import wait_for

PGBOUNCER = "/usr/sbin/pgbouncer"
START_TIMEOUT_S = 15.0
#: server connections per database and user: more than one process's pools ever hold
#: transactions at once, fewer than they hold connections (so they are shared)
POOL_SIZE = 10


def _missing(reason: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{reason} (CI must have it: `make pgbouncer-deps`)")
    pytest.skip(f"{reason}: run `make pgbouncer-deps`")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _quoted(value: str) -> str:
    # the auth file's quoting: a double quote is doubled
    return '"' + value.replace('"', '""') + '"'


@dataclass
class Bouncer:
    """One running pgbouncer and how to reach a database through it."""

    port: int
    proc: subprocess.Popen[bytes]
    log: Path
    #: the database served by one server connection (pool_size=1)
    single_db: str

    def dsn(self, direct_dsn: str) -> str:
        """``direct_dsn`` (a database of the test server) through this pgbouncer."""
        return make_conninfo(direct_dsn, host="127.0.0.1", port=str(self.port))

    def tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError as exc:
            return f"<no log: {exc}>"


def _config(server: dict[str, Any], port: int, workdir: Path, single_db: str) -> str:
    host = server.get("host") or "127.0.0.1"
    target = f"host={host} port={server.get('port') or 5432}"
    return "\n".join(
        [
            "[databases]",
            f"{single_db} = {target} dbname={single_db} pool_size=1",
            f"* = {target}",
            "[pgbouncer]",
            "listen_addr = 127.0.0.1",
            f"listen_port = {port}",
            "unix_socket_dir =",
            "auth_type = trust",
            f"auth_file = {workdir / 'userlist.txt'}",
            "pool_mode = transaction",
            f"default_pool_size = {POOL_SIZE}",
            "max_client_conn = 500",
            "server_round_robin = 1",
            f"logfile = {workdir / 'pgbouncer.log'}",
            "ignore_startup_parameters = extra_float_digits",
            "",
        ]
    )


def _start(binary: str, server_dsn: str, single_db: str) -> tuple[Bouncer, Path]:
    server = conninfo_to_dict(server_dsn)
    workdir = Path(tempfile.mkdtemp(prefix="deadman-pgbouncer-"))
    workdir.chmod(0o755)
    user = str(server.get("user") or os.environ.get("USER") or "postgres")
    (workdir / "userlist.txt").write_text(
        f"{_quoted(user)} {_quoted(str(server.get('password') or ''))}\n"
    )
    port = _free_port()
    (workdir / "pgbouncer.ini").write_text(_config(server, port, workdir, single_db))
    log = workdir / "pgbouncer.log"
    kwargs: dict[str, Any] = {}
    if as_postgres():  # pgbouncer refuses to run as root, like Postgres
        pg = postgres_user()
        for path in [workdir, *workdir.iterdir()]:
            os.chown(path, pg.pw_uid, pg.pw_gid)
        kwargs = {"user": pg.pw_uid, "group": pg.pw_gid, "extra_groups": []}
    proc = subprocess.Popen(
        [binary, str(workdir / "pgbouncer.ini")],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        cwd="/",
        **kwargs,
    )
    return Bouncer(port=port, proc=proc, log=log, single_db=single_db), workdir


def _ready(bouncer: Bouncer, server_dsn: str) -> bool:
    if bouncer.proc.poll() is not None:
        raise AssertionError(f"pgbouncer exited {bouncer.proc.returncode}: {bouncer.tail()}")
    try:
        with psycopg.connect(bouncer.dsn(server_dsn), connect_timeout=2) as conn:
            conn.execute("SELECT 1")
    except psycopg.OperationalError:
        return False
    return True


@pytest.fixture(scope="session")
def pgbouncer(pg_server_dsn: str, template_db: str) -> Iterator[Bouncer]:
    """The session's pgbouncer, in front of the test server."""
    binary = PGBOUNCER if Path(PGBOUNCER).exists() else shutil.which("pgbouncer")
    if binary is None:
        _missing(f"{PGBOUNCER} is not installed")
        return
    single_db = f"deadman_pgbouncer_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_server_dsn, autocommit=True) as admin:
        admin.execute(
            sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                sql.Identifier(single_db), sql.Identifier(template_db)
            )
        )
    bouncer, workdir = _start(binary, pg_server_dsn, single_db)
    try:
        try:
            wait_for(
                lambda: _ready(bouncer, pg_server_dsn),
                START_TIMEOUT_S,
                interval=0.05,
                message="pgbouncer to accept connections",
            )
        except AssertionError as exc:
            raise AssertionError(f"{exc}; log: {bouncer.tail()}") from None
        yield bouncer
    finally:
        died = bouncer.proc.poll() is not None
        bouncer.proc.terminate()
        try:
            bouncer.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            bouncer.proc.kill()
            bouncer.proc.wait(timeout=10)
        if died:
            sys.stderr.write(f"\n----- pgbouncer log -----\n{bouncer.tail()}\n")
        shutil.rmtree(workdir, ignore_errors=True)
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
    return pgbouncer.dsn(make_conninfo(pg_server_dsn, dbname=pgbouncer.single_db))


@pytest.fixture
def through_pgbouncer(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process's connections as behind PgBouncer: unprepared, not listening
    (the settings deadman/db/pool.py and the listeners read from the environment)."""
    monkeypatch.setenv("DEADMAN_PREPARE", "off")
    monkeypatch.setenv("DEADMAN_LISTEN", "off")
    monkeypatch.delenv("DEADMAN_LISTEN_URL", raising=False)
