"""Processes started while Postgres is down (bug 10): real ``deadman worker``,
``rescuer``, ``migrate`` and ``serve`` processes pointed at a cluster of this
module's own that is stopped, then started under them.

Each waits with a ``database_waiting`` log line per try and stays alive; once the
cluster is up it connects and works (a worker runs a job, a rescuer rescues one,
migrate migrates, serve turns ready). SIGTERM during the wait exits 0 at once. What
waiting cannot fix (no such database, a newer schema) exits 2 at once, in one line.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pytest

from deadman import devdb
from deadman.db.migrate import latest_version, migrate
from tests.factories import connect, expire_lease, insert_job
from tests.helpers import wait_for
from tests.helpers.processes import (
    Proc,
    Spawner,
    SpawnRescuer,
    SpawnWorker,
    job_state,
    sql_value,
    wait_registered,
    wait_state,
)

#: Python start-up and imports on a loaded 2-core machine, then the first try.
FIRST_TRY_S = 20.0
#: Backoff is capped at 10 s: once Postgres is up, the next try comes within that.
AFTER_START_S = 30.0
#: trust auth ignores it; it must never reach a log line
PASSWORD = "s3cret-pw"


def _free_port(*avoid: int) -> int:
    """A port nothing listens on now, and none of ``avoid``: the stopped cluster's
    port is free too while it is down, and a server given it would answer its own
    database connections (once: "server closed the connection unexpectedly")."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in avoid:
            return port


class Down:
    """This module's cluster, stopped at the start of every test. ``migrated`` is a
    database with the schema, ``empty`` one without; both fresh per test."""

    def __init__(self, cluster: devdb.Cluster) -> None:
        self.cluster = cluster
        self.migrated = ""
        self.empty = ""

    def dsn(self, dbname: str) -> str:
        return f"postgresql://postgres:{PASSWORD}@127.0.0.1:{self.cluster.port}/{dbname}"

    def start(self) -> None:
        self.cluster.start()


@pytest.fixture(scope="module")
def _cluster() -> Iterator[devdb.Cluster]:
    root = Path(tempfile.mkdtemp(prefix="deadman-startup-", dir="/tmp"))
    root.chmod(0o755)
    cluster = devdb.Cluster(root / "data", port=_free_port())
    cluster._owned_root = root
    try:
        cluster.init(fast=True)
        yield cluster
    finally:
        cluster.destroy()


@pytest.fixture
def down(_cluster: devdb.Cluster) -> Iterator[Down]:
    _cluster.start()
    d = Down(_cluster)
    suffix = f"{time.monotonic_ns()}"
    d.migrated, d.empty = f"migrated_{suffix}", f"empty_{suffix}"
    with psycopg.connect(_cluster.dsn(), autocommit=True) as conn:
        for name in (d.migrated, d.empty):
            conn.execute(f'CREATE DATABASE "{name}"'.encode())
    migrate(_cluster.dsn(d.migrated))
    _cluster.stop("fast")
    try:
        yield d
    finally:
        _cluster.stop("immediate")


def _alive_and_waiting(proc: Proc, tries: int = 2, **match: object) -> list[dict[str, object]]:
    """Wait for ``tries`` database_waiting lines; the process must still be running."""

    def waiting() -> list[dict[str, object]] | None:
        assert proc.poll() is None, f"{proc.name} exited {proc.poll()}:\n{proc.tail()}"
        lines = [
            e
            for e in proc.events("database_waiting")
            if all(e.get(k) == v for k, v in match.items())
        ]
        return lines if len(lines) >= tries else None

    lines = wait_for(waiting, FIRST_TRY_S, interval=0.05, message=f"{proc.name} to wait")
    assert proc.poll() is None
    return lines


def _assert_clean_log(proc: Proc) -> None:
    text = proc.log_text()
    assert "Traceback" not in text
    assert PASSWORD not in text


# --------------------------------------------------------------------------- waiting


def test_a_worker_started_while_postgres_is_down_waits_then_runs_jobs(
    down: Down, spawn_worker: SpawnWorker
) -> None:
    dsn = down.dsn(down.migrated)
    worker = spawn_worker(dsn)
    lines = _alive_and_waiting(worker, waiting_for="connection")
    first = lines[0]
    assert first["process"] == "worker"
    assert f"port={down.cluster.port}" in str(first["dsn"])
    assert "refused" in str(first["reason"]).lower()
    assert isinstance(first["retry_in_s"], float) and 0 < first["retry_in_s"] <= 10
    assert [e["attempt"] for e in lines[:2]] == [1, 2]

    down.start()
    wait_registered(dsn, worker.pid, timeout=AFTER_START_S)
    assert worker.events("database_ready")
    with connect(dsn) as conn:
        job = insert_job(conn, type="noop")
    wait_state(dsn, job.id, "succeeded", timeout=20)
    worker.send(signal.SIGTERM)
    assert worker.wait_exit(20) == 0
    _assert_clean_log(worker)


def test_a_worker_waits_for_the_schema_a_migrate_is_about_to_create(
    down: Down, spawn_worker: SpawnWorker
) -> None:
    """The compose case: the worker starts with the database, before the one-shot
    migrate container has run."""
    down.start()
    dsn = down.dsn(down.empty)
    worker = spawn_worker(dsn)
    lines = _alive_and_waiting(worker, waiting_for="schema")
    assert "deadman migrate" in str(lines[0]["reason"])
    migrate(dsn)
    wait_registered(dsn, worker.pid, timeout=AFTER_START_S)
    worker.send(signal.SIGTERM)
    assert worker.wait_exit(20) == 0
    _assert_clean_log(worker)


def test_a_rescuer_started_while_postgres_is_down_waits_then_rescues(
    down: Down, spawn_rescuer: SpawnRescuer
) -> None:
    dsn = down.dsn(down.migrated)
    rescuer = spawn_rescuer(dsn)
    _alive_and_waiting(rescuer, process="rescuer")
    down.start()
    with connect(dsn) as conn:
        job = insert_job(conn, state="running")
        expire_lease(conn, job.id)
    wait_state(dsn, job.id, "queued", timeout=AFTER_START_S)
    rescuer.send(signal.SIGTERM)
    assert rescuer.wait_exit(20) == 0
    _assert_clean_log(rescuer)


def test_migrate_started_while_postgres_is_down_waits_then_migrates(
    down: Down, _spawner: Spawner
) -> None:
    dsn = down.dsn(down.empty)
    proc = _spawner.start(["migrate", "--database-url", dsn], "migrate", {})
    _alive_and_waiting(proc, process="migrate")
    down.start()
    assert proc.wait_exit(AFTER_START_S) == 0
    assert "applied" in proc.log_text()
    version = sql_value(dsn, "SELECT max(version) FROM deadman.schema_migrations")
    assert version == latest_version()
    _assert_clean_log(proc)


def test_serve_started_while_postgres_is_down_is_up_and_turns_ready(
    down: Down, _spawner: Spawner
) -> None:
    """An HTTP server comes up at once (a health check must see it) and says 503 on
    /ready until the database is there."""
    dsn = down.dsn(down.migrated)
    port = _free_port(down.cluster.port)
    url = f"http://127.0.0.1:{port}"
    proc = _spawner.start(["serve", "--port", str(port), "--database-url", dsn], "serve", {})

    def answers(path: str, status: int) -> bool:
        assert proc.poll() is None, proc.tail()
        try:
            # /ready waits up to the pool timeout (5 s) before its 503
            return httpx.get(url + path, timeout=10).status_code == status
        except httpx.HTTPError:
            return False

    wait_for(lambda: answers("/health", 200), FIRST_TRY_S, interval=0.1, message="/health")
    assert answers("/ready", 503)
    event = proc.wait_event("database_unavailable_at_start", 5)
    # the attempt's own error: usually "Connection refused"; while the cluster is down its
    # port is free, and another test's server may hold it for a moment ("server closed
    # the connection unexpectedly": seen once in a fresh-clone `make test`)
    reason = str(event["reason"]).lower()
    assert f"port {down.cluster.port} failed" in reason, reason
    # the pool's reconnection failures are log lines like ours, not bare text
    reconnects = [e for e in proc.events() if e.get("logger") == "psycopg.pool"]
    assert reconnects and all(e["level"] == "warning" for e in reconnects)
    assert "error connecting" not in "".join(
        line for line in proc.log_text().splitlines() if not line.startswith("{")
    )
    down.start()
    wait_for(lambda: answers("/ready", 200), AFTER_START_S, interval=0.1, message="/ready 200")
    proc.send(signal.SIGTERM)
    # uvicorn re-raises the signal once its graceful shutdown is done
    assert proc.wait_exit(20) in (0, -signal.SIGTERM)
    assert PASSWORD not in proc.log_text()


def test_a_worker_waits_while_postgres_is_in_recovery_then_runs(
    down: Down, spawn_worker: SpawnWorker
) -> None:
    """A server that is up but refuses connections while it recovers ("the database
    system is starting up" after a crash; here, persistently, a standby with hot
    standby off: "... is not accepting connections") is waited out like an outage."""
    cluster = down.cluster
    conf = cluster.datadir / "deadman.conf"
    original = conf.read_text(encoding="utf-8")
    signal_file = cluster.datadir / "standby.signal"
    devdb._write_owned(conf, original + "hot_standby = off\n")
    devdb._write_owned(signal_file, "")
    try:
        started = devdb._run(
            [
                str(cluster._bin("pg_ctl")),
                "start",
                "--pgdata",
                str(cluster.datadir),
                "--log",
                str(cluster.datadir / "deadman.log"),
                "--wait",
                "--silent",
            ]
        )
        assert started.returncode == 0, started.stdout + started.stderr
        dsn = down.dsn(down.migrated)
        worker = spawn_worker(dsn)
        lines = _alive_and_waiting(worker, waiting_for="connection")
        assert "not accepting connections" in str(lines[0]["reason"])
        cluster.stop("fast")
    finally:
        signal_file.unlink(missing_ok=True)
        devdb._write_owned(conf, original)
    down.start()
    wait_registered(dsn, worker.pid, timeout=AFTER_START_S)
    with connect(dsn) as conn:
        job = insert_job(conn, type="noop")
    wait_state(dsn, job.id, "succeeded", timeout=20)
    _assert_clean_log(worker)


def test_a_fleet_waits_once_then_starts_its_children(down: Down, spawn_worker: SpawnWorker) -> None:
    dsn = down.dsn(down.migrated)
    fleet = spawn_worker(dsn, processes=2)
    _alive_and_waiting(fleet, process="worker")
    assert not fleet.events("fleet_child_started"), "children started before the database"
    down.start()
    wait_for(
        lambda: sql_value(dsn, "SELECT count(*) FROM deadman.workers") == 2,
        AFTER_START_S,
        message="both fleet children to register",
    )
    fleet.send(signal.SIGTERM)
    assert fleet.wait_exit(30) == 0
    _assert_clean_log(fleet)


# --------------------------------------------------------------------------- stopping


@pytest.mark.parametrize("command", ["worker", "rescuer", "migrate"])
def test_sigterm_during_the_wait_exits_0_at_once(command: str, _spawner: Spawner) -> None:
    nowhere = f"postgresql://postgres:{PASSWORD}@127.0.0.1:{_free_port()}/postgres"
    proc = _spawner.start([command, "--database-url", nowhere], command, {})
    _alive_and_waiting(proc, tries=1)
    sent = time.monotonic()
    proc.send(signal.SIGTERM)
    assert proc.wait_exit(5) == 0
    assert time.monotonic() - sent < 5
    assert proc.events("startup_wait_stopped")
    _assert_clean_log(proc)


def test_a_worker_waiting_for_its_database_dumps_its_stacks_and_waits_on(
    _spawner: Spawner,
) -> None:
    """SIGUSR1 during the start-up wait (DECISIONS 97's addendum): the stacks show
    the wait, and the worker carries on waiting (the default action would end it)."""
    nowhere = f"postgresql://postgres:{PASSWORD}@127.0.0.1:{_free_port()}/postgres"
    proc = _spawner.start(["worker", "--database-url", nowhere], "worker", {})
    _alive_and_waiting(proc, tries=1)
    stacks = proc.stacks()
    assert "in _wait_for_database" in stacks, stacks[-3000:]
    _alive_and_waiting(proc, tries=2)  # still there, and trying again
    proc.send(signal.SIGTERM)
    assert proc.wait_exit(5) == 0


def test_the_wait_limit_ends_in_exit_3_and_one_line(_spawner: Spawner) -> None:
    nowhere = f"postgresql://postgres:{PASSWORD}@127.0.0.1:{_free_port()}/postgres"
    proc = _spawner.start(
        ["worker", "--database-url", nowhere], "worker", {"DEADMAN_STARTUP_WAIT_S": "1.5"}
    )
    assert proc.wait_exit(FIRST_TRY_S) == 3
    last = proc.log_text().strip().splitlines()[-1]
    assert last.startswith("deadman: worker: gave up waiting for the database")
    assert "DEADMAN_STARTUP_WAIT_S=1.5" in last
    _assert_clean_log(proc)


# --------------------------------------------------------------------------- no waiting


def _run(argv: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    from tests.helpers.processes import FAST_ENV, REPO

    full = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), **FAST_ENV, **env}
    return subprocess.run(
        [sys.executable, "-m", "deadman", *argv],
        cwd=REPO,
        env=full,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_what_waiting_cannot_fix_exits_2_at_once(down: Down) -> None:
    down.start()
    no_db = down.dsn("no_such_database")
    for command in ("worker", "rescuer", "migrate", "serve"):
        done = _run([command, "--database-url", no_db])
        assert done.returncode == 2, (command, done.stderr)
        assert "Traceback" not in done.stderr and PASSWORD not in done.stderr
        assert 'database "no_such_database" does not exist' in done.stderr.splitlines()[-1]

    newer = down.dsn(down.migrated)
    with psycopg.connect(newer, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO deadman.schema_migrations (version, name) VALUES (%s, 'future')",
            (latest_version() + 1,),
        )
    for command in ("worker", "rescuer"):
        done = _run([command, "--database-url", newer])
        assert done.returncode == 2, (command, done.stderr)
        assert "newer than this code" in done.stderr and "Traceback" not in done.stderr


def test_a_job_inserted_while_a_worker_waits_runs_once_it_connects(
    down: Down, spawn_worker: SpawnWorker
) -> None:
    """The outage is the database's, not the queue's: work submitted before the
    worker got through is there when it does."""
    dsn = down.dsn(down.migrated)
    worker = spawn_worker(dsn)
    _alive_and_waiting(worker, tries=1)
    down.start()
    with connect(dsn) as conn:
        job = insert_job(conn, type="noop")
    wait_state(dsn, job.id, "succeeded", timeout=AFTER_START_S)
    assert job_state(dsn, job.id) == "succeeded"


# --------------------------------------------------------------------------- pieces


@pytest.mark.parametrize(
    "message",
    [
        'connection to server at "127.0.0.1", port 5432 failed: Connection refused',
        'connection to server at "h", port 5432 failed: FATAL:  the database system is starting up',
        "FATAL:  the database system is not yet accepting connections",
        "FATAL:  the database system is shutting down",
        "FATAL:  the database system is in recovery mode",
        "FATAL:  sorry, too many clients already",
        "failed to resolve host 'db': [Errno -2] Name or service not known",
        "connection timeout expired",
    ],
)
def test_outages_are_waited_out(message: str) -> None:
    from deadman.db.startup import is_permanent

    assert not is_permanent(message)


@pytest.mark.parametrize(
    "message",
    [
        'FATAL:  password authentication failed for user "app"',
        'FATAL:  role "nobody" does not exist',
        'FATAL:  database "nope" does not exist',
        'FATAL:  no pg_hba.conf entry for host "10.0.0.1", user "app", database "x"',
        'FATAL:  role "reader" is not permitted to log in',
        "fe_sendauth: no password supplied",
    ],
)
def test_misconfiguration_is_not_waited_out(message: str) -> None:
    from deadman.db.startup import is_permanent

    assert is_permanent(message)


def test_the_dsn_in_logs_has_no_password_and_the_backoff_is_capped() -> None:
    from deadman.db.startup import backoff_s, redact

    shown = redact("postgresql://app:hunter2@db:5433/jobs?sslpassword=x2")
    assert "hunter2" not in shown and "x2" not in shown
    assert "host=db" in shown and "port=5433" in shown and "dbname=jobs" in shown
    assert redact("not a dsn") == "<invalid connection string>"
    pauses = [backoff_s(n) for n in range(1, 200)]
    assert 0.25 <= pauses[0] <= 0.5
    assert max(pauses) <= 10.0 and min(pauses[10:]) >= 5.0
