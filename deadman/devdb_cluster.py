"""One Postgres cluster devdb controls (a data directory, a postmaster): init, start,
stop, destroy."""

from __future__ import annotations

import math
import re
import shutil
import subprocess
import time
from pathlib import Path

import psycopg

from deadman.devdb_os import (
    PG_USER,
    PORT_NAME,
    free_port,
    is_zombie,
    postmaster_pid,
    prepare_datadir,
    read_port,
    run,
    write_owned,
)

_CONF_NAME = "deadman.conf"
_LOG_NAME = "deadman.log"
_STOP_MODES = frozenset({"smart", "fast", "immediate"})


class Cluster:
    """One Postgres cluster (one data directory, one postmaster) that we control.

    ``port=None`` means: the port recorded in the data directory if there is one,
    otherwise a free port picked now. A port that differs from the recorded one is
    written to the configuration on the next :meth:`start`.
    """

    def __init__(self, datadir: Path, port: int | None = None) -> None:
        # pg_ctl runs with cwd="/" (the postgres user may not be able to enter ours).
        self._datadir = Path(datadir).absolute()
        recorded = read_port(self._datadir)
        self._port = port if port is not None else (recorded or free_port())
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
        return f"postgresql://{PG_USER}@127.0.0.1:{self._port}/{dbname}"

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
        prepare_datadir(self._datadir)
        args = [
            str(self._bin("initdb")),
            f"--pgdata={self._datadir}",
            "--auth=trust",
            f"--username={PG_USER}",
            "--encoding=UTF8",
            # C collation: deterministic ordering and no dependence on installed locales.
            "--no-locale",
            "--no-instructions",
        ]
        if fast:
            args.append("--no-sync")
        result = run(args)
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
        if read_port(self._datadir) != self._port:
            self._write_port()
        pid = postmaster_pid(self._datadir)
        if pid is not None and is_zombie(pid):
            # The postmaster would take the zombie for a live owner of the lock file and
            # refuse to start. A zombie runs no code, so the file is safe to remove.
            (self._datadir / "postmaster.pid").unlink(missing_ok=True)
        result = self._pg_ctl(
            "start", "--log", str(self._datadir / _LOG_NAME), wait_s=max(1, math.ceil(timeout))
        )
        if result.returncode != 0:
            raise self._failed("pg_ctl start", result)
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
        result = self._pg_ctl("stop", "--mode", mode, wait_s=60)
        if result.returncode != 0 and self.is_running():
            raise self._failed(f"pg_ctl stop -m {mode}", result)

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
        pid = postmaster_pid(self._datadir)
        if pid is not None and is_zombie(pid):
            return False
        return self._pg_ctl("status").returncode == 0

    def destroy(self) -> None:
        """Stop the server (immediately: its data is about to go) and delete its files."""
        if self._datadir.exists():
            self.stop("immediate")
        shutil.rmtree(self._owned_root or self._datadir, ignore_errors=True)

    def _bin(self, name: str) -> Path:
        if self._bindir is None:
            from deadman.devdb import find_pg_bindir  # devdb imports this module

            self._bindir = find_pg_bindir()
        return self._bindir / name

    def _pg_ctl(
        self, action: str, *options: str, wait_s: int | None = None
    ) -> subprocess.CompletedProcess[str]:
        """``pg_ctl ACTION --pgdata DATADIR OPTIONS``; with ``wait_s``, waiting (quietly)
        that many seconds for the action to complete."""
        args = [str(self._bin("pg_ctl")), action, "--pgdata", str(self._datadir), *options]
        if wait_s is not None:
            args += ["--wait", "--timeout", str(wait_s), "--silent"]
        return run(args)

    def _failed(self, what: str, result: subprocess.CompletedProcess[str]) -> RuntimeError:
        """The error for a pg_ctl that failed: its output and the server log's tail."""
        return RuntimeError(
            f"{what} failed for {self!r} (exit {result.returncode}): "
            f"{(result.stdout + result.stderr).strip()}\n{self._log_tail()}"
        )

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
        write_owned(self._datadir / _CONF_NAME, "\n".join(lines) + "\n")
        write_owned(self._datadir / PORT_NAME, f"{self._port}\n")

    def _write_port(self) -> None:
        conf = self._datadir / _CONF_NAME
        text, count = re.subn(
            r"^port = \d+$", f"port = {self._port}", conf.read_text(encoding="utf-8"), flags=re.M
        )
        if count != 1:
            raise RuntimeError(f"{conf} has no 'port = N' line to rewrite")
        write_owned(conf, text)
        write_owned(self._datadir / PORT_NAME, f"{self._port}\n")

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
