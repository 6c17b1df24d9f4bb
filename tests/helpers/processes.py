"""Real ``deadman`` processes for the acceptance tests, and the SQL they read the
database with.

Every process a test starts goes through ``Spawner`` (the ``spawn_worker`` and
``spawn_rescuer`` fixtures of tests/acceptance/conftest.py), which gives it short
timings (a 2 s lease instead of 10 s, so a rescue takes seconds), JSON logs in a file
under ``tmp_path``, and its own process group.

Tests never sleep for a fixed time: they wait on a condition with a deadline
(``wait_for``), reading the database or the process's log.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Protocol

import psycopg
from psycopg.rows import dict_row

from deadman.stackdump import request_dump
from tests.helpers import wait_for

REPO = Path(__file__).resolve().parents[2]

#: Short timings: a lease lapses 2 s after the last heartbeat and is rescued within
#: another 0.5 s, so every fault test finishes in seconds. Heartbeat at a quarter of
#: the TTL: a beat may be late once without losing the lease.
TTL_S = 2.0
HEARTBEAT_S = 0.5
RESCUE_S = 0.5
POLL_S = 0.5

FAST_ENV: dict[str, str] = {
    "DEADMAN_LEASE_TTL_S": str(TTL_S),
    "DEADMAN_HEARTBEAT_S": str(HEARTBEAT_S),
    "DEADMAN_RESCUE_S": str(RESCUE_S),
    "DEADMAN_POLL_S": str(POLL_S),
    "DEADMAN_SHUTDOWN_GRACE_S": "5",
    "DEADMAN_LOG_FORMAT": "json",
    "DEADMAN_LOG_LEVEL": "info",
}

#: For the tests of a guarantee (every job once, none lost, none run twice), whose
#: leases must never lapse: trusted for 9.5 s after each renewal instead of TTL_S's
#: 1.5 s. A stall of the loaded 2-core test machine (1.5 s is seen) would otherwise
#: lose a lease, rescue a healthy job and fail the test for no bug of ours.
STEADY_TTL_S = 10.0

#: How late a loaded machine may make anything we wait for (a wake-up, a rescue, an
#: exit). Bounds are measured on the database's clock where it is the authority and
#: add this slack; the tests that tell a NOTIFY from a poll set the poll to 30 s, so
#: a bound this loose still tells them apart.
LATE_S = 5.0

#: Python start-up plus imports plus the first heartbeat, on a loaded 2-core machine.
START_TIMEOUT_S = 20.0

APP = "tests.acceptance.poison_app:registry"


# --------------------------------------------------------------------------- SQL


def sql_all(dsn: str, query: str, params: Any = None) -> list[dict[str, Any]]:
    """Run one statement in autocommit and return its rows as dicts."""
    with psycopg.connect(dsn, autocommit=True, row_factory=dict_row) as conn:
        cur = conn.execute(query.encode(), params)
        return cur.fetchall() if cur.description else []


def sql_one(dsn: str, query: str, params: Any = None) -> dict[str, Any] | None:
    rows = sql_all(dsn, query, params)
    return rows[0] if rows else None


def sql_value(dsn: str, query: str, params: Any = None) -> Any:
    """The first column of the first row (None when there is no row)."""
    row = sql_one(dsn, query, params)
    return None if row is None else next(iter(row.values()))


def all_succeeded(dsn: str, ids: list[int]) -> bool:
    """Whether every job of ``ids`` has succeeded."""
    n = sql_value(
        dsn,
        "SELECT count(*) FROM deadman.jobs WHERE id = ANY(%s) AND state = 'succeeded'",
        (ids,),
    )
    return int(n) == len(ids)


def job_row(dsn: str, job_id: int) -> dict[str, Any]:
    row = sql_one(dsn, "SELECT * FROM deadman.jobs WHERE id = %s", (job_id,))
    assert row is not None, f"job {job_id} is gone"
    return row


def job_state(dsn: str, job_id: int) -> str:
    return str(job_row(dsn, job_id)["state"])


def attempts_of(dsn: str, job_id: int) -> list[dict[str, Any]]:
    """The job's ended attempts in claim order (lease tokens come from one sequence)."""
    return sql_all(
        dsn, "SELECT * FROM deadman.attempts WHERE job_id = %s ORDER BY lease_token", (job_id,)
    )


def states_of(dsn: str, ids: list[int]) -> dict[str, int]:
    rows = sql_all(
        dsn,
        "SELECT state, count(*) AS n FROM deadman.jobs WHERE id = ANY(%s) GROUP BY state",
        (ids,),
    )
    return {r["state"]: int(r["n"]) for r in rows}


def wait_state(dsn: str, job_id: int, state: str, timeout: float) -> dict[str, Any]:
    """Wait until the job is in ``state``; returns the row."""

    def check() -> dict[str, Any] | None:
        row = job_row(dsn, job_id)
        return row if row["state"] == state else None

    return wait_for(check, timeout, interval=0.02, message=f"job {job_id} to be {state}")


def wait_all_state(dsn: str, ids: list[int], state: str, timeout: float) -> None:
    wait_for(
        lambda: states_of(dsn, ids).get(state, 0) == len(ids) or None,
        timeout,
        interval=0.1,
        message=f"all {len(ids)} jobs to be {state} (by state: see last value)",
    )


TRANSITION_LOG_SQL = """
CREATE TABLE public.test_transitions (
    job_id bigint, old_state text, new_state text, attempt int, rescues int,
    delay_s float8, at timestamptz
);
CREATE FUNCTION public.test_log_transition() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- now() is the changing statement's own timestamp: for a retry, run_at - now() is
    -- exactly the delay the worker chose.
    INSERT INTO public.test_transitions
    VALUES (NEW.id, OLD.state, NEW.state, NEW.attempt, NEW.rescues,
            extract(epoch FROM NEW.run_at - now()), now());
    RETURN NULL;
END $$;
CREATE TRIGGER test_log_transition AFTER UPDATE ON deadman.jobs FOR EACH ROW
    WHEN (OLD.state IS DISTINCT FROM NEW.state)
    EXECUTE FUNCTION public.test_log_transition();
"""


def install_transition_log(dsn: str) -> None:
    """Record every state change of every job (test database only): states that last
    only milliseconds, like a released job before another worker claims it, become
    observable without racing the workers."""
    sql_all(dsn, TRANSITION_LOG_SQL)


def transitions(dsn: str, job_id: int | None = None) -> list[dict[str, Any]]:
    return sql_all(
        dsn,
        "SELECT * FROM public.test_transitions"
        " WHERE %(id)s::bigint IS NULL OR job_id = %(id)s ORDER BY job_id, at",
        {"id": job_id},
    )


def db_now(dsn: str) -> Any:
    """The database's clock: every lease and schedule is measured on it."""
    return sql_value(dsn, "SELECT clock_timestamp()")


# --------------------------------------------------------------------------- processes


def log_events(text: str, event: str | None = None) -> list[dict[str, Any]]:
    """A process's JSON log lines (other lines skipped), optionally only those whose
    ``event`` is ``event``."""
    out: list[dict[str, Any]] = []
    for line in text.splitlines():
        if not line.startswith("{"):
            continue
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a line cut short by SIGKILL
        if event is None or record.get("event") == event:
            out.append(record)
    return out


@dataclass
class Proc:
    """One process a test started (a worker, a fleet supervisor or a rescuer)."""

    name: str
    argv: list[str]
    popen: subprocess.Popen[bytes]
    log_path: Path
    log_file: IO[bytes]
    started_at: float = field(default_factory=time.monotonic)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def send(self, sig: int) -> None:
        self.popen.send_signal(sig)

    def poll(self) -> int | None:
        return self.popen.poll()

    def wait_exit(self, timeout: float) -> int:
        """Wait for the process to exit; returns its exit code."""
        code: int = wait_for(
            lambda: self.popen.poll(),
            timeout,
            interval=0.02,
            message=f"{self.name} (pid {self.pid}) to exit",
        )
        return code

    def log_text(self) -> str:
        # The child writes to the file descriptor directly; nothing of ours to flush.
        return self.log_path.read_text(errors="replace")

    def events(self, event: str | None = None) -> list[dict[str, Any]]:
        """The JSON log lines (fleet children write to the same file), optionally
        only those whose ``event`` is ``event``."""
        return log_events(self.log_text(), event)

    def wait_event(self, event: str, timeout: float, **match: Any) -> dict[str, Any]:
        def find() -> dict[str, Any] | None:
            for record in self.events(event):
                if all(record.get(k) == v for k, v in match.items()):
                    return record
            return None

        return wait_for(find, timeout, interval=0.05, message=f"{self.name} to log {event}")

    def stacks(self, timeout: float = 5.0) -> str:
        """Every thread's Python stack, from the log (deadman.stackdump.request_dump);
        empty if none came within ``timeout``."""
        return request_dump(self.pid, self.log_path, timeout)

    def tail(self, lines: int = 60) -> str:
        try:
            return "\n".join(self.log_text().splitlines()[-lines:])
        except OSError as exc:
            return f"<no log: {exc}>"


class SpawnWorker(Protocol):
    def __call__(
        self,
        dsn: str,
        *,
        processes: int = 1,
        concurrency: int | None = 10,
        queues: str | None = None,
        app: str | None = APP,
        no_rescuer: bool = False,
        name: str | None = None,
        **env: str | float | int,
    ) -> Proc: ...


class SpawnRescuer(Protocol):
    def __call__(self, dsn: str, *, name: str | None = None, **env: str | float | int) -> Proc: ...


class Spawner:
    def __init__(self, tmp_path: Path) -> None:
        self._tmp = tmp_path
        self.procs: list[Proc] = []

    def start(
        self,
        args: list[str],
        name: str,
        env: dict[str, str | float | int],
        prefix: Sequence[str] = (),
    ) -> Proc:
        """``deadman <args>``; ``prefix`` goes before it (e.g. ``ip netns exec <ns>``)."""
        full_env = dict(os.environ)
        # Only what the test says: no database URL or timing leaking in from outside.
        for key in [k for k in full_env if k.startswith("DEADMAN_")]:
            del full_env[key]
        full_env.update(FAST_ENV)
        full_env.update({k: str(v) for k, v in env.items()})
        full_env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p
        )
        full_env["PYTHONUNBUFFERED"] = "1"
        argv = [*prefix, sys.executable, "-m", "deadman", *args]
        log_path = self._tmp / f"{len(self.procs):02d}-{name}.log"
        log_file = log_path.open("wb")
        popen = subprocess.Popen(
            argv,
            cwd=REPO,
            env=full_env,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            # Its own process group: teardown kills the fleet's children with it.
            start_new_session=True,
        )
        proc = Proc(name=name, argv=argv, popen=popen, log_path=log_path, log_file=log_file)
        self.procs.append(proc)
        return proc

    def kill_all(self) -> None:
        for proc in self.procs:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.popen.wait(timeout=10)
            proc.log_file.close()


# --------------------------------------------------------------------------- workers


def worker_rows(dsn: str) -> list[dict[str, Any]]:
    return sql_all(dsn, "SELECT * FROM deadman.workers ORDER BY started_at, id")


def wait_registered(dsn: str, pid: int, timeout: float = START_TIMEOUT_S) -> str:
    """Wait until the worker process ``pid`` has sent its first heartbeat (it does so
    before its first claim); returns its worker id."""
    worker_id: str = wait_for(
        lambda: sql_value(dsn, "SELECT id FROM deadman.workers WHERE pid = %s", (pid,)),
        timeout,
        interval=0.05,
        message=f"worker pid {pid} to register",
    )
    return worker_id


def wait_workers(dsn: str, n: int, timeout: float = START_TIMEOUT_S) -> list[dict[str, Any]]:
    """Wait until at least ``n`` worker rows exist; returns them."""

    def enough() -> list[dict[str, Any]] | None:
        rows = worker_rows(dsn)
        return rows if len(rows) >= n else None

    return wait_for(
        enough,
        timeout,
        interval=0.05,
        message=f"{n} workers to register",
    )


def wait_fleet_ready(dsn: str, fleet: Proc, n: int, timeout: float = START_TIMEOUT_S) -> set[int]:
    """Wait until ``n`` live children of ``fleet`` have registered; returns their pids.

    A child registers after installing its signal handlers, so a SIGTERM sent now is
    handled gracefully, not by Python's default action (see the fleet start-up test).
    """

    def ready() -> set[int] | None:
        pids = {
            r["pid"]
            for r in worker_rows(dsn)
            if pid_alive(r["pid"]) and parent_pid(r["pid"]) == fleet.pid
        }
        return pids if len(pids) >= n else None

    return wait_for(ready, timeout, interval=0.05, message=f"{n} live fleet children")


def wait_held(dsn: str, job_id: int, worker_id: str, timeout: float = 10.0) -> int:
    """Wait until ``worker_id`` holds the job (running under its lease); returns the
    lease token."""
    token: int = wait_for(
        lambda: sql_value(
            dsn,
            "SELECT lease_token FROM deadman.jobs"
            " WHERE id = %s AND state = 'running' AND lease_worker = %s",
            (job_id, worker_id),
        ),
        timeout,
        interval=0.01,
        message=f"worker {worker_id} to hold job {job_id}",
    )
    return token


def process_state(pid: int) -> str | None:
    """The process's state letter (R, S, T for stopped, Z...); None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            # the state letter follows the parenthesised command name
            return f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return None


def pid_alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    return process_state(pid) not in (None, "Z")


def parent_pid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (FileNotFoundError, IndexError, ValueError):
        return None
