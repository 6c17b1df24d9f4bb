"""devdb against real clusters. Each test pays one initdb (about a second), so they are
few and each walks through a whole lifecycle."""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from deadman import devdb


def query_one(dsn: str, query: str) -> object:
    with psycopg.connect(dsn, connect_timeout=5) as conn:
        row = conn.execute(query.encode()).fetchone()
    assert row is not None
    return row[0]


@pytest.fixture
def base() -> Iterator[Path]:
    # Not tmp_path: /tmp/pytest-of-root is 0700 and the postgres user could not enter it.
    root = Path(tempfile.mkdtemp(prefix="deadman-devdb-test-", dir="/tmp"))
    root.chmod(0o755)
    try:
        yield root / "pg"
    finally:
        devdb.stop(root / "pg")
        shutil.rmtree(root, ignore_errors=True)


def test_a_checkout_the_postgres_user_cannot_enter_still_gets_its_database() -> None:
    """A clone inside a private directory (``mktemp -d`` makes them 0700): as root,
    the data directory goes under /tmp and .deadman/pg/data links to it; as a normal
    user the server runs as that user, who can enter the directory, so no link."""
    private = Path(tempfile.mkdtemp(prefix="deadman-private-", dir="/tmp"))  # 0700
    base = private / "checkout" / ".deadman" / "pg"
    try:
        dsn = devdb.ensure_running(base)
        assert query_one(dsn, "SELECT 1") == 1
        link = base / "data"
        assert link.is_symlink() == (os.geteuid() == 0)
        home = link.resolve()
        assert devdb.ensure_running(base) == dsn  # found again through the link
        devdb.stop(base)
        assert devdb.ensure_running(base) == dsn  # and started again
        devdb.stop(base, remove=True)
        assert not link.is_symlink()
        assert home.exists() == (os.geteuid() != 0)
    finally:
        devdb.stop(base, remove=True)
        shutil.rmtree(private, ignore_errors=True)


def test_throwaway_cluster_lifecycle() -> None:
    cluster = devdb.throwaway()
    try:
        assert cluster.is_running()
        assert query_one(cluster.dsn(), "SELECT 1") == 1
        assert query_one(cluster.dsn(), "SHOW fsync") == "off"
        assert query_one(cluster.dsn(), "SHOW synchronous_commit") == "on"
        if os.geteuid() == 0:
            assert cluster.datadir.stat().st_uid == pwd.getpwnam("postgres").pw_uid

        # Another process finds the running cluster through the recorded port.
        other = devdb.Cluster(cluster.datadir)
        assert other.port == cluster.port
        assert other.is_running()

        port = cluster.port
        cluster.restart()
        assert cluster.is_running()
        assert cluster.port == port
        assert query_one(cluster.dsn(), "SELECT 2") == 2

        cluster.stop()
        assert not cluster.is_running()
        with pytest.raises(psycopg.OperationalError):
            psycopg.connect(cluster.dsn(), connect_timeout=2)
        cluster.stop()  # stopping a stopped cluster is a no-op

        cluster.start()
        assert query_one(cluster.dsn(), "SELECT 3") == 3
        with pytest.raises(RuntimeError, match="already running"):
            cluster.start()

        cluster.restart(mode="immediate")  # crash recovery on the way up
        assert query_one(cluster.dsn(), "SELECT 4") == 4
    finally:
        cluster.destroy()
    assert not cluster.datadir.exists()
    assert not cluster.datadir.parent.exists()


def test_ensure_running_is_idempotent_and_survives_a_stolen_port(base: Path) -> None:
    dsn = devdb.ensure_running(base)
    assert dsn.endswith("/deadman")
    assert devdb.ensure_running(base) == dsn
    assert query_one(dsn, "SELECT current_database()") == "deadman"
    # The demo cluster is durable: only the throwaway test clusters turn fsync off.
    assert query_one(dsn, "SHOW fsync") == "on"
    assert query_one(dsn, "SHOW full_page_writes") == "on"

    devdb.stop(base)
    devdb.stop(base)
    cluster = devdb.Cluster(base / "data")
    assert not cluster.is_running()
    assert devdb.ensure_running(base) == dsn  # recorded port still free: reused

    devdb.stop(base)
    with socket.socket() as squatter:
        # The stopped server's connections may linger in TIME_WAIT on this port;
        # SO_REUSEADDR lets us bind anyway (and, listening, we still block Postgres).
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        squatter.bind(("127.0.0.1", cluster.port))
        squatter.listen()
        # Starting on the taken port fails loudly, with the server's own complaint.
        with pytest.raises(RuntimeError, match=r"(?s)pg_ctl start failed.*Address already in use"):
            cluster.start()
        moved = devdb.ensure_running(base)
    assert moved != dsn
    assert devdb.Cluster(base / "data").port != cluster.port
    assert query_one(moved, "SELECT current_database()") == "deadman"
    assert devdb.ensure_running(base) == moved


def test_unreachable_parent_is_reported_before_initdb(tmp_path: Path) -> None:
    """tmp_path lives under /tmp/pytest-of-<user> (0700). As root the server runs as
    the postgres user, who cannot enter it: a clear error before initdb runs. As a
    normal user the server runs as that user, who can: initdb succeeds."""
    cluster = devdb.Cluster(tmp_path / "data")
    if os.geteuid() == 0:
        with pytest.raises(RuntimeError, match="cannot reach"):
            cluster.init()
        assert not (tmp_path / "data" / "PG_VERSION").exists()
    else:
        cluster.init()
        assert (tmp_path / "data" / "PG_VERSION").exists()
