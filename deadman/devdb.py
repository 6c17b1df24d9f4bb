"""A private, throwaway PostgreSQL cluster for `make demo` and the tests.

Nothing here is for production: the cluster trusts every local connection, listens on
127.0.0.1 only (no Unix socket, so long data directory paths cannot overflow the
107-byte socket path limit), and lives in a directory the caller owns.

Postgres refuses to run as root. When this process is root, the data directory is
handed to the ``postgres`` OS user and ``initdb``/``pg_ctl`` run as that user; every
directory above the data directory must then be traversable by ``postgres`` (pytest's
``/tmp/pytest-of-root`` is not, which is why :func:`throwaway` uses its own temp dir).

Files this module keeps in the data directory, next to Postgres's own:
``deadman.conf`` (our settings, included from ``postgresql.conf``), ``deadman-port``
(the port, so another process can find a running cluster) and ``deadman.log``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import psycopg
from psycopg import sql

from deadman.devdb_cluster import Cluster
from deadman.devdb_os import (
    as_postgres,
    free_port,
    locked,
    make_dirs,
    port_is_free,
    reachable,
    run,
    write_owned,
)

__all__ = ["Cluster", "ensure_running", "find_pg_bindir", "stop", "throwaway"]

# What tests reach for under their old names: a tool run, a file written, as the
# user the server runs as.
_run = run
_write_owned = write_owned

# Debian/Ubuntu install each major version side by side here; module-level so tests
# can point it elsewhere.
_DEBIAN_ROOT = Path("/usr/lib/postgresql")
_SERVER_BINARIES = ("initdb", "pg_ctl", "postgres")
_DEMO_DBNAME = "deadman"


def find_pg_bindir() -> Path:
    """Return the directory holding the PostgreSQL server binaries.

    Looked up in order: ``$DEADMAN_PG_BINDIR``; ``pg_config --bindir``; ``initdb`` on
    ``PATH`` (following symlinks, because ``/usr/local/bin`` often holds links or lone
    copies); the highest ``/usr/lib/postgresql/<version>/bin``. A directory counts only
    if it has ``initdb``, ``pg_ctl`` *and* ``postgres``: ``pg_ctl`` starts the
    ``postgres`` found next to itself.

    Raises RuntimeError naming everything that was tried. An explicit
    ``DEADMAN_PG_BINDIR`` that lacks the binaries is an error, not a fallthrough: the
    user asked for that directory.
    """
    tried: list[str] = []

    override = os.environ.get("DEADMAN_PG_BINDIR")
    if override:
        if _has_server_binaries(Path(override)):
            return Path(override)
        raise RuntimeError(
            f"DEADMAN_PG_BINDIR={override} does not contain {', '.join(_SERVER_BINARIES)}"
        )
    tried.append("$DEADMAN_PG_BINDIR: not set")

    pg_config = shutil.which("pg_config")
    if pg_config is None:
        tried.append("pg_config --bindir: pg_config not on PATH")
    else:
        try:
            out = subprocess.run(
                [pg_config, "--bindir"], capture_output=True, text=True, check=True, timeout=10
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError) as exc:
            tried.append(f"pg_config --bindir: failed ({exc})")
        else:
            if out and _has_server_binaries(Path(out)):
                return Path(out)
            tried.append(f"pg_config --bindir: {out or '(empty)'} lacks the server binaries")

    on_path: list[str] = []
    for entry in os.environ.get("PATH", "").split(os.pathsep):
        initdb = Path(entry or ".") / "initdb"
        if not (initdb.is_file() and os.access(initdb, os.X_OK)):
            continue
        for candidate in (initdb.resolve().parent, initdb.parent):
            if _has_server_binaries(candidate):
                return candidate
        on_path.append(str(initdb))
    if on_path:
        tried.append(f"initdb on PATH: {', '.join(on_path)} (no pg_ctl/postgres beside it)")
    else:
        tried.append("initdb on PATH: not found")

    versions = sorted(
        (_version_key(d.name), d / "bin")
        for d in (_DEBIAN_ROOT.iterdir() if _DEBIAN_ROOT.is_dir() else [])
        if _version_key(d.name) is not None
    )
    for _, bindir in reversed(versions):
        if _has_server_binaries(bindir):
            return bindir
    tried.append(f"{_DEBIAN_ROOT}/<version>/bin: none with the server binaries")

    raise RuntimeError(
        "PostgreSQL server binaries (initdb, pg_ctl, postgres) not found. Tried:\n  "
        + "\n  ".join(tried)
        + "\nInstall the PostgreSQL server (e.g. apt-get install postgresql) or set "
        "DEADMAN_PG_BINDIR, or point DEADMAN_DATABASE_URL at an existing server."
    )


def ensure_running(base: Path) -> str:
    """Make sure the cluster kept under ``base`` runs; return the DSN of its ``deadman`` db.

    The data directory is ``base/data``. Idempotent and safe to call from several
    processes at once (they serialise on ``base/lock``): a missing cluster is created,
    a stopped one is started (on its recorded port if that is still free, otherwise on
    a new one, written to its config), a running one is left alone. A stale
    ``postmaster.pid`` after a reboot is handled by pg_ctl.
    """
    base = Path(base).absolute()
    make_dirs(base)
    with locked(base / "lock"):
        datadir = _data_home(base)
        cluster = Cluster(datadir)
        if not (datadir / "PG_VERSION").exists():
            cluster.init()
            cluster.start()
        elif not cluster.is_running():
            if not port_is_free(cluster.port):
                cluster = Cluster(datadir, port=free_port())
            cluster.start()
        with psycopg.connect(cluster.dsn(), autocommit=True) as conn:
            exists = conn.execute(
                "SELECT 1 FROM pg_database WHERE datname = %s", (_DEMO_DBNAME,)
            ).fetchone()
            if exists is None:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(_DEMO_DBNAME)))
        return cluster.dsn(_DEMO_DBNAME)


def stop(base: Path, *, remove: bool = False) -> None:
    """Stop the cluster kept under ``base`` (see :func:`ensure_running`), if running;
    with ``remove``, also delete a data directory that was placed under /tmp because
    ``base`` was out of the postgres user's reach (``make clean``)."""
    link = Path(base).absolute() / "data"
    datadir = link.resolve()
    if (datadir / "PG_VERSION").exists():
        Cluster(datadir).stop()
    if remove and link.is_symlink():
        shutil.rmtree(datadir.parent, ignore_errors=True)
        link.unlink()


def _data_home(base: Path) -> Path:
    """``base/data``; or, when we run Postgres as the postgres user and it cannot reach
    ``base`` (a checkout inside a private directory, such as one from ``mktemp -d``),
    a directory under /tmp that ``base/data`` links to. Found again through the link;
    a link whose target vanished (a reboot cleared /tmp) is replaced."""
    link = base / "data"
    if link.is_symlink():
        if link.resolve().exists():
            return link.resolve()
        link.unlink()
    if not as_postgres() or link.exists() or reachable(base):
        return link
    home = Path(tempfile.mkdtemp(prefix="deadman-devdb-", dir="/tmp"))
    home.chmod(0o755)
    link.symlink_to(home / "data")
    return home / "data"


def throwaway(prefix: str = "deadman-test-") -> Cluster:
    """Create and start a fast (fsync off) cluster in a fresh temp dir under /tmp.

    The caller owns it: call :meth:`Cluster.destroy` to stop it and delete the dir.
    """
    root = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    root.chmod(0o755)  # mkdtemp makes it 0700, which the postgres user cannot enter
    cluster = Cluster(root / "data")
    cluster._owned_root = root
    try:
        cluster.init(fast=True)
        cluster.start()
    except BaseException:
        cluster.destroy()
        raise
    return cluster


def _has_server_binaries(bindir: Path) -> bool:
    return all(
        (bindir / name).is_file() and os.access(bindir / name, os.X_OK) for name in _SERVER_BINARIES
    )


def _version_key(name: str) -> tuple[int, ...] | None:
    """'15' -> (15,), '9.6' -> (9, 6); None for anything that is not a version."""
    if not re.fullmatch(r"\d+(\.\d+)*", name):
        return None
    return tuple(int(part) for part in name.split("."))
