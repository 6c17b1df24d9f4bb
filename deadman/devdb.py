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

import contextlib
import fcntl
import math
import os
import pwd
import re
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
from psycopg import sql

__all__ = ["Cluster", "ensure_running", "find_pg_bindir", "stop", "throwaway"]

# Debian/Ubuntu install each major version side by side here; module-level so tests
# can point it elsewhere.
_DEBIAN_ROOT = Path("/usr/lib/postgresql")
_SERVER_BINARIES = ("initdb", "pg_ctl", "postgres")
_PG_USER = "postgres"
_CONF_NAME = "deadman.conf"
_PORT_NAME = "deadman-port"
_LOG_NAME = "deadman.log"
_DEMO_DBNAME = "deadman"
_STOP_MODES = frozenset({"smart", "fast", "immediate"})


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


class Cluster:
    """One Postgres cluster (one data directory, one postmaster) that we control.

    ``port=None`` means: the port recorded in the data directory if there is one,
    otherwise a free port picked now. A port that differs from the recorded one is
    written to the configuration on the next :meth:`start`.
    """

    def __init__(self, datadir: Path, port: int | None = None) -> None:
        # pg_ctl runs with cwd="/" (the postgres user may not be able to enter ours).
        self._datadir = Path(datadir).absolute()
        recorded = _read_port(self._datadir)
        self._port = port if port is not None else (recorded or _free_port())
        self._bindir: Path | None = None
        # Set by throwaway(): the temp dir destroy() removes, wider than the datadir.
        self._owned_root: Path | None = None

    def __repr__(self) -> str:
        return f"Cluster(datadir={str(self._datadir)!r}, port={self._port})"

    @property
    def port(self) -> int:
        return self._port

    @property
    def datadir(self) -> Path:
        return self._datadir

    def dsn(self, dbname: str = "postgres") -> str:
        return f"postgresql://{_PG_USER}@127.0.0.1:{self._port}/{dbname}"

    def init(self, fast: bool = False) -> None:
        """Create the cluster with ``initdb`` and write our settings.

        ``fast=True`` is for tests only: it turns off ``fsync`` and
        ``full_page_writes``, so an OS crash can corrupt the cluster. It leaves
        ``synchronous_commit`` alone so commit semantics match production. Without it
        the cluster is as durable as a stock one: durability is what we demonstrate.

        Raises RuntimeError if the directory is not empty or initdb fails.
        """
        if self._datadir.exists() and any(self._datadir.iterdir()):
            raise RuntimeError(f"{self._datadir} is not empty; refusing to initdb over it")
        _prepare_datadir(self._datadir)
        args = [
            str(self._bin("initdb")),
            f"--pgdata={self._datadir}",
            "--auth=trust",
            f"--username={_PG_USER}",
            "--encoding=UTF8",
            # C collation: deterministic ordering and no dependence on installed locales.
            "--no-locale",
            "--no-instructions",
        ]
        if fast:
            args.append("--no-sync")
        result = _run(args)
        if result.returncode != 0:
            raise RuntimeError(
                f"initdb failed for {self._datadir} (exit {result.returncode}):\n"
                f"{result.stdout}{result.stderr}"
            )
        with (self._datadir / "postgresql.conf").open("a", encoding="utf-8") as conf:
            conf.write(f"\ninclude '{_CONF_NAME}'\n")
        self._write_settings(fast)

    def start(self, timeout: float = 30) -> None:
        """Start the postmaster and return once a client connection succeeds.

        Raises RuntimeError, with the tail of the server log, if the server is already
        running, does not start (port taken, bad config) or does not accept a
        connection within ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout
        if self.is_running():
            raise RuntimeError(f"{self!r} is already running")
        if _read_port(self._datadir) != self._port:
            self._write_port()
        pid = _postmaster_pid(self._datadir)
        if pid is not None and _is_zombie(pid):
            # The postmaster would take the zombie for a live owner of the lock file and
            # refuse to start. A zombie runs no code, so the file is safe to remove.
            (self._datadir / "postmaster.pid").unlink(missing_ok=True)
        result = _run(
            [
                str(self._bin("pg_ctl")),
                "start",
                "--pgdata",
                str(self._datadir),
                "--log",
                str(self._datadir / _LOG_NAME),
                "--wait",
                "--timeout",
                str(max(1, math.ceil(timeout))),
                "--silent",
            ]
        )
        if result.returncode != 0:
            raise RuntimeError(
                f"pg_ctl start failed for {self!r} (exit {result.returncode}): "
                f"{(result.stdout + result.stderr).strip()}\n{self._log_tail()}"
            )
        self._wait_connectable(deadline)

    def stop(self, mode: str = "fast") -> None:
        """Stop the server; a no-op if it is not running.

        ``smart`` waits for clients to disconnect, ``fast`` disconnects them and shuts
        down cleanly, ``immediate`` aborts without a checkpoint (crash recovery runs at
        the next start, which is what crash tests want).
        """
        if mode not in _STOP_MODES:
            raise ValueError(f"stop mode must be one of {sorted(_STOP_MODES)}, not {mode!r}")
        if not self.is_running():
            return
        result = _run(
            [
                str(self._bin("pg_ctl")),
                "stop",
                "--pgdata",
                str(self._datadir),
                "--mode",
                mode,
                "--wait",
                "--timeout",
                "60",
                "--silent",
            ]
        )
        if result.returncode != 0 and self.is_running():
            raise RuntimeError(
                f"pg_ctl stop -m {mode} failed for {self!r} (exit {result.returncode}): "
                f"{(result.stdout + result.stderr).strip()}\n{self._log_tail()}"
            )

    def restart(self, mode: str = "fast") -> None:
        """Stop (with ``mode``) and start again on the same port."""
        self.stop(mode)
        self.start()

    def is_running(self) -> bool:
        # No pid file: certainly down, and we skip a subprocess. A stale pid file (after
        # a reboot or kill -9) is judged by pg_ctl, which checks the process exists --
        # but a killed postmaster that init has not reaped yet still "exists".
        if not (self._datadir / "postmaster.pid").exists():
            return False
        pid = _postmaster_pid(self._datadir)
        if pid is not None and _is_zombie(pid):
            return False
        result = _run([str(self._bin("pg_ctl")), "status", "--pgdata", str(self._datadir)])
        return result.returncode == 0

    def destroy(self) -> None:
        """Stop the server (immediately: its data is about to go) and delete its files."""
        if self._datadir.exists():
            self.stop("immediate")
        shutil.rmtree(self._owned_root or self._datadir, ignore_errors=True)

    def _bin(self, name: str) -> Path:
        if self._bindir is None:
            self._bindir = find_pg_bindir()
        return self._bindir / name

    def _write_settings(self, fast: bool) -> None:
        lines = [
            "# Written by deadman.devdb; the port line is rewritten when the port changes.",
            "listen_addresses = '127.0.0.1'",
            f"port = {self._port}",
            "unix_socket_directories = ''",
            "max_connections = 200",
            "shared_buffers = 128MB",
        ]
        if fast:
            lines += [
                "# Test cluster: an OS crash may corrupt it. synchronous_commit untouched.",
                "fsync = off",
                "full_page_writes = off",
            ]
        _write_owned(self._datadir / _CONF_NAME, "\n".join(lines) + "\n")
        _write_owned(self._datadir / _PORT_NAME, f"{self._port}\n")

    def _write_port(self) -> None:
        conf = self._datadir / _CONF_NAME
        text, count = re.subn(
            r"^port = \d+$", f"port = {self._port}", conf.read_text(encoding="utf-8"), flags=re.M
        )
        if count != 1:
            raise RuntimeError(f"{conf} has no 'port = N' line to rewrite")
        _write_owned(conf, text)
        _write_owned(self._datadir / _PORT_NAME, f"{self._port}\n")

    def _wait_connectable(self, deadline: float) -> None:
        # pg_ctl --wait already waited for "ready" in postmaster.pid; this catches the
        # cases where that is not enough (e.g. the port is served by someone else).
        last_error: Exception | None = None
        while True:
            remaining = deadline - time.monotonic()
            try:
                with psycopg.connect(
                    self.dsn(), connect_timeout=max(1, min(5, math.ceil(remaining)))
                ) as conn:
                    conn.execute("SELECT 1")
                return
            except psycopg.OperationalError as exc:
                last_error = exc
            if time.monotonic() >= deadline:
                raise RuntimeError(
                    f"{self!r} started but refused connections: {last_error}\n{self._log_tail()}"
                )
            time.sleep(0.05)

    def _log_tail(self, lines: int = 30) -> str:
        log = self._datadir / _LOG_NAME
        try:
            tail = log.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:]
        except OSError as exc:
            return f"(server log {log} unreadable: {exc})"
        return f"--- last {len(tail)} lines of {log} ---\n" + "\n".join(tail)


def ensure_running(base: Path) -> str:
    """Make sure the cluster kept under ``base`` runs; return the DSN of its ``deadman`` db.

    The data directory is ``base/data``. Idempotent and safe to call from several
    processes at once (they serialise on ``base/lock``): a missing cluster is created,
    a stopped one is started (on its recorded port if that is still free, otherwise on
    a new one, written to its config), a running one is left alone. A stale
    ``postmaster.pid`` after a reboot is handled by pg_ctl.
    """
    base = Path(base).absolute()
    _make_dirs(base)
    with _locked(base / "lock"):
        datadir = _data_home(base)
        cluster = Cluster(datadir)
        if not (datadir / "PG_VERSION").exists():
            cluster.init()
            cluster.start()
        elif not cluster.is_running():
            if not _port_is_free(cluster.port):
                cluster = Cluster(datadir, port=_free_port())
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
    if not _as_postgres() or link.exists() or _reachable(base):
        return link
    home = Path(tempfile.mkdtemp(prefix="deadman-devdb-", dir="/tmp"))
    home.chmod(0o755)
    link.symlink_to(home / "data")
    return home / "data"


def _reachable(path: Path) -> bool:
    """Can the postgres user enter ``path`` (search permission on every ancestor)?"""
    return _run(["test", "-x", str(path)]).returncode == 0


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


def _as_postgres() -> bool:
    return os.geteuid() == 0


def _postgres_user() -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(_PG_USER)
    except KeyError:
        raise RuntimeError(
            f"running as root, but there is no {_PG_USER!r} OS user to run Postgres as "
            "(Postgres refuses to run as root); create one or run as a normal user"
        ) from None


def _run(args: list[str]) -> subprocess.CompletedProcess[str]:
    """Run a Postgres tool, as the postgres user when we are root.

    PG* variables are dropped so the caller's PGDATA/PGPORT/PGHOST cannot redirect the
    tools. start_new_session keeps the terminal's Ctrl-C from reaching the postmaster
    pg_ctl leaves behind; stopping it is our job.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    if not _as_postgres():
        return subprocess.run(
            args, capture_output=True, text=True, env=env, cwd="/", start_new_session=True
        )
    user = _postgres_user()
    env.update(HOME=user.pw_dir, USER=user.pw_name, LOGNAME=user.pw_name)
    return subprocess.run(
        args,
        capture_output=True,
        text=True,
        env=env,
        cwd="/",
        start_new_session=True,
        user=user.pw_uid,
        group=user.pw_gid,
        extra_groups=os.getgrouplist(user.pw_name, user.pw_gid),
    )


def _make_dirs(path: Path) -> None:
    """mkdir -p, leaving every directory we create (as root) enterable by postgres."""
    missing = [p for p in (path, *path.parents) if not p.exists()]
    path.mkdir(parents=True, exist_ok=True)
    if _as_postgres():
        for created in missing:
            created.chmod(0o755)


def _prepare_datadir(datadir: Path) -> None:
    _make_dirs(datadir.parent)
    datadir.mkdir(mode=0o700, exist_ok=True)
    if not _as_postgres():
        return
    user = _postgres_user()
    os.chown(datadir, user.pw_uid, user.pw_gid)
    # access(2) as the postgres user checks search permission on every ancestor.
    if not _reachable(datadir):
        raise RuntimeError(
            f"the {_PG_USER!r} user cannot reach {datadir}: every parent directory must "
            "be traversable by it (e.g. chmod o+x), and pytest's /tmp/pytest-of-root is "
            "not; use a directory such as one made by tempfile.mkdtemp(dir='/tmp') + chmod 755"
        )


def _write_owned(path: Path, text: str) -> None:
    """Write a file in the datadir, owned by the user the server runs as."""
    path.write_text(text, encoding="utf-8")
    if _as_postgres():
        user = _postgres_user()
        os.chown(path, user.pw_uid, user.pw_gid)


def _read_port(datadir: Path) -> int | None:
    try:
        return int((datadir / _PORT_NAME).read_text(encoding="utf-8").strip())
    except (OSError, ValueError):
        return None


def _postmaster_pid(datadir: Path) -> int | None:
    """The pid in postmaster.pid; None if the file is missing or (being written) unparsable."""
    try:
        return int((datadir / "postmaster.pid").read_text(encoding="utf-8").split("\n", 1)[0])
    except (OSError, ValueError):
        return None


def _is_zombie(pid: int) -> bool:
    """True if ``pid`` has exited but not been reaped (Linux /proc; False elsewhere)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8")
    except OSError:
        return False
    # Field 3, after the parenthesised command name (which may itself contain ')').
    return stat.rpartition(")")[2].split()[:1] == ["Z"]


def _free_port() -> int:
    """A port nothing listens on now. Another process could take it before Postgres
    binds it; start() then fails loudly with the log tail rather than misbehaving."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _port_is_free(port: int) -> bool:
    # SO_REUSEADDR as Postgres sets it: TIME_WAIT leftovers do not count as taken,
    # a listener does.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
