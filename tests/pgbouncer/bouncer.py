"""Start and stop a throwaway PgBouncer in transaction mode in front of a Postgres
server: for tests/pgbouncer/ (conftest.py) and the benchmark's "through PgBouncer"
row (bench/pgbouncer_latency.py), one launcher for both.

Debian's ``pgbouncer`` (``make pgbouncer-deps``), in the foreground, so that
:meth:`Bouncer.stop` ends exactly the process :func:`start` started. It listens on a
free 127.0.0.1 port and no Unix socket. Clients are trusted (``auth_type = trust``;
the user must still be in the auth file), and the server login is the server DSN's
own. Every database name is routed to the server (``* =``), so any database is
reachable through it as it is directly: :meth:`Bouncer.dsn`.

``server_round_robin = 1``: consecutive transactions of one client land on different
server connections as often as PgBouncer can make them, which is what a busy
production pooler does and what exposes session state that leaked from one
transaction into the next. ``single_db`` (optional) is served by exactly one server
connection (``pool_size=1``), on which two clients' session state collides
deterministically.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from deadman.devdb_os import as_postgres, postgres_user
from tests.helpers import wait_for

PGBOUNCER = "/usr/sbin/pgbouncer"
START_TIMEOUT_S = 15.0
#: server connections per database and user: more than one process's pools ever hold
#: transactions at once, fewer than they hold connections (so they are shared)
POOL_SIZE = 10


def binary() -> str | None:
    """The pgbouncer executable, or None when it is not installed."""
    return PGBOUNCER if Path(PGBOUNCER).exists() else shutil.which("pgbouncer")


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
    workdir: Path
    #: the database served by one server connection (pool_size=1), if any
    single_db: str | None

    @property
    def log(self) -> Path:
        return self.workdir / "pgbouncer.log"

    def dsn(self, direct_dsn: str) -> str:
        """``direct_dsn`` (a database of the server) through this pgbouncer."""
        return make_conninfo(direct_dsn, host="127.0.0.1", port=str(self.port))

    def tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError as exc:
            return f"<no log: {exc}>"

    def stop(self) -> bool:
        """SIGTERM (SIGKILL after 10 s) and remove its files; False if it had died."""
        alive = self.proc.poll() is None
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        shutil.rmtree(self.workdir, ignore_errors=True)
        return alive


def _config(server: dict[str, Any], port: int, workdir: Path, single_db: str | None) -> str:
    host = server.get("host") or "127.0.0.1"
    target = f"host={host} port={server.get('port') or 5432}"
    single = [f"{single_db} = {target} dbname={single_db} pool_size=1"] if single_db else []
    return "\n".join(
        [
            "[databases]",
            *single,
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


def _ready(bouncer: Bouncer, server_dsn: str) -> bool:
    if bouncer.proc.poll() is not None:
        raise RuntimeError(f"pgbouncer exited {bouncer.proc.returncode}: {bouncer.tail()}")
    try:
        with psycopg.connect(bouncer.dsn(server_dsn), connect_timeout=2) as conn:
            conn.execute("SELECT 1")
    except psycopg.OperationalError:
        return False
    return True


def start(server_dsn: str, single_db: str | None = None) -> Bouncer:
    """A pgbouncer in front of ``server_dsn``'s server, accepting connections."""
    exe = binary()
    if exe is None:
        raise FileNotFoundError(f"{PGBOUNCER} is not installed (make pgbouncer-deps)")
    server = conninfo_to_dict(server_dsn)
    workdir = Path(tempfile.mkdtemp(prefix="deadman-pgbouncer-"))
    workdir.chmod(0o755)
    user = str(server.get("user") or os.environ.get("USER") or "postgres")
    (workdir / "userlist.txt").write_text(
        f"{_quoted(user)} {_quoted(str(server.get('password') or ''))}\n"
    )
    port = _free_port()
    (workdir / "pgbouncer.ini").write_text(_config(server, port, workdir, single_db))
    kwargs: dict[str, Any] = {}
    if as_postgres():  # pgbouncer refuses to run as root, like Postgres
        pg = postgres_user()
        for path in [workdir, *workdir.iterdir()]:
            os.chown(path, pg.pw_uid, pg.pw_gid)
        kwargs = {"user": pg.pw_uid, "group": pg.pw_gid, "extra_groups": []}
    proc = subprocess.Popen(
        [exe, str(workdir / "pgbouncer.ini")],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        cwd="/",
        **kwargs,
    )
    bouncer = Bouncer(port=port, proc=proc, workdir=workdir, single_db=single_db)
    try:
        try:
            wait_for(lambda: _ready(bouncer, server_dsn), START_TIMEOUT_S, interval=0.05)
        except AssertionError as exc:
            raise RuntimeError(f"pgbouncer did not accept connections: {bouncer.tail()}") from exc
    except BaseException:
        bouncer.stop()
        raise
    return bouncer
