"""``make demo``: a private Postgres (unless DEADMAN_DATABASE_URL is set), a fleet of
worker processes, the HTTP API (``deadman serve``) through which a mix of jobs is
submitted, their states live until all are final, a summary. Stops what it started.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import psycopg

from deadman import devdb
from deadman.db.migrate import migrate
from deadman.db.startup import redact
from deadman.model import Backoff, JobState
from deadman.store import NewJob

# Short timings so retries and rescues are visible within seconds.
DEMO_ENV = {
    "DEADMAN_LEASE_TTL_S": "5",
    "DEADMAN_HEARTBEAT_S": "1",
    "DEADMAN_RESCUE_S": "1",
    "DEADMAN_POLL_S": "1",
    "DEADMAN_LOG_FORMAT": "json",
}
FAST = Backoff(strategy="exponential", base_ms=100, max_ms=1000, jitter="full")


@dataclass(frozen=True)
class Group:
    label: str
    jobs: list[NewJob]
    expect: JobState


def _groups() -> list[Group]:
    return [
        Group("noop x20", [NewJob("noop", {"i": i}) for i in range(20)], JobState.SUCCEEDED),
        Group(
            "sleep 200-1000 ms x5",
            [NewJob("sleep", {"ms": 200 * (i + 1)}) for i in range(5)],
            JobState.SUCCEEDED,
        ),
        Group(
            "flaky p=0.4 x5 (retries)",
            [NewJob("flaky", {"p": 0.4}, max_attempts=12, backoff=FAST) for _ in range(5)],
            JobState.SUCCEEDED,
        ),
        Group(
            "fail x2 (max_attempts 3)",
            [
                NewJob("fail", {"message": "card declined"}, max_attempts=3, backoff=FAST)
                for _ in range(2)
            ],
            JobState.DEAD,
        ),
        Group(
            "delayed 2 s x3",
            [NewJob("noop", {"delayed": True}, delay_ms=2000) for _ in range(3)],
            JobState.SUCCEEDED,
        ),
        Group(
            "priority 50 x5",
            [NewJob("noop", {"vip": True}, priority=50) for _ in range(5)],
            JobState.SUCCEEDED,
        ),
        Group(
            "cpu x2", [NewJob("cpu", {"iterations": 200_000}) for _ in range(2)], JobState.SUCCEEDED
        ),
        Group("side-effect x1", [NewJob("side-effect", {})], JobState.SUCCEEDED),
    ]


def run_demo(database_url: str | None, devdb_base: Path, timeout_s: float = 120.0) -> int:
    dsn = database_url or os.environ.get("DEADMAN_DATABASE_URL")
    started_db = False
    if not dsn:
        print(f"starting a private Postgres under {devdb_base} ...", flush=True)
        dsn = devdb.ensure_running(devdb_base)
        started_db = True
    print(f"database: {redact(dsn)}")  # never its password
    applied = migrate(dsn)
    print(f"migrations: {'applied ' + str(applied) if applied else 'up to date'}")

    env = dict(os.environ, DEADMAN_DATABASE_URL=dsn, **DEMO_ENV)
    log_path = devdb_base.parent / "demo-workers.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log_file:
        fleet = subprocess.Popen(
            [sys.executable, "-m", "deadman", "worker", "--processes", "2", "--concurrency", "8"],
            env=env,
            stdout=log_file,
            stderr=log_file,
        )
    print(f"worker fleet: 2 processes x 8 slots (pid {fleet.pid}, logs in {log_path})")
    api: subprocess.Popen[bytes] | None = None
    try:
        with open(devdb_base.parent / "demo-api.log", "ab") as api_log:
            api, base_url = _start_api(dsn, env, api_log)
        print(f"HTTP API: {base_url} (pid {api.pid}, logs in {devdb_base.parent / 'demo-api.log'})")
        return _submit_and_watch(dsn, base_url, timeout_s)
    finally:
        if api is not None:
            api.send_signal(signal.SIGTERM)
            try:
                api.wait(timeout=15)
                print("HTTP API stopped")
            except subprocess.TimeoutExpired:
                api.kill()
                print("HTTP API did not stop in 15 s; killed")
        fleet.send_signal(signal.SIGTERM)
        try:
            code = fleet.wait(timeout=30)
            print(f"worker fleet stopped (exit {code})")
        except subprocess.TimeoutExpired:
            fleet.kill()
            print("worker fleet did not stop in 30 s; killed")
        if started_db:
            devdb.stop(devdb_base)
            print("private Postgres stopped")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start_api(
    dsn: str, env: dict[str, str], log_file: IO[bytes], timeout_s: float = 30.0
) -> tuple[subprocess.Popen[bytes], str]:
    """``deadman serve`` on a free 127.0.0.1 port; returns once /ready says 200."""
    port = _free_port()
    api = subprocess.Popen(
        [sys.executable, "-m", "deadman", "serve", "--port", str(port), "--database-url", dsn],
        env={k: v for k, v in env.items() if k != "DEADMAN_API_TOKEN"},
        stdout=log_file,
        stderr=log_file,
    )
    base_url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout_s
    while True:
        if api.poll() is not None:
            raise RuntimeError(f"deadman serve exited with {api.returncode}; see its log")
        try:
            with urllib.request.urlopen(base_url + "/ready", timeout=2) as r:
                if r.status == 200:
                    return api, base_url
        except (urllib.error.URLError, OSError):
            pass
        if time.monotonic() > deadline:
            api.kill()
            raise RuntimeError(f"deadman serve did not become ready in {timeout_s} s")
        time.sleep(0.1)


def _job_body(job: NewJob) -> dict[str, Any]:
    body: dict[str, Any] = {"type": job.type, "payload": job.payload, "queue": job.queue}
    body["priority"] = job.priority
    body["backoff"] = job.backoff.to_json()
    if job.delay_ms:
        body["delay_ms"] = job.delay_ms
    if job.max_attempts is not None:
        body["max_attempts"] = job.max_attempts
    return body


def _post_job(base_url: str, body: dict[str, Any], key: str, timeout_s: float = 30.0) -> int:
    """POST /jobs with an Idempotency-Key, retrying the same key on 503 or a dropped
    connection until the server acknowledges it (201, or 200 for a replay)."""
    data = json.dumps(body).encode()
    deadline = time.monotonic() + timeout_s
    while True:
        request = urllib.request.Request(
            base_url + "/jobs",
            data=data,
            method="POST",
            headers={"Content-Type": "application/json", "Idempotency-Key": key},
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as r:
                return int(json.loads(r.read())["id"])
        except urllib.error.HTTPError as exc:
            if exc.code != 503 or time.monotonic() > deadline:
                raise RuntimeError(f"POST /jobs answered {exc.code}: {exc.read()!r}") from exc
        except (urllib.error.URLError, OSError):
            if time.monotonic() > deadline:
                raise
        time.sleep(0.2)


def _submit_and_watch(dsn: str, base_url: str, timeout_s: float) -> int:
    groups = _groups()
    ids: dict[str, list[int]] = {}
    run = uuid.uuid4().hex[:8]  # keys unique to this demo run: a rerun submits anew
    for g in groups:
        ids[g.label] = [
            _post_job(base_url, _job_body(j), f"demo-{run}-{g.label}-{i}")
            for i, j in enumerate(g.jobs)
        ]
    all_ids = [i for v in ids.values() for i in v]
    print(f"submitted {len(all_ids)} jobs through the HTTP API (POST /jobs, Idempotency-Key)\n")
    deadline = time.monotonic() + timeout_s
    tty = sys.stdout.isatty()
    with psycopg.connect(dsn, autocommit=True) as conn:
        while True:
            rows = conn.execute(
                "SELECT id, state, attempt FROM deadman.jobs WHERE id = ANY(%s)", [all_ids]
            ).fetchall()
            states = {int(r[0]): JobState(r[1]) for r in rows}
            counts = Counter(s.value for s in states.values())
            line = "  ".join(f"{s.value}={counts.get(s.value, 0)}" for s in JobState)
            print(("\r" if tty else "") + line, end="" if tty else "\n", flush=True)
            if all(s.terminal for s in states.values()) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        print("\n")
        ok = _summary(conn, groups, ids)
    return 0 if ok else 1


def _summary(
    conn: psycopg.Connection[tuple[object, ...]],
    groups: list[Group],
    ids: dict[str, list[int]],
) -> bool:
    ok = True
    print(f"{'group':<28} {'expected':<10} {'got':<26} {'attempts':<10} verdict")
    for g in groups:
        rows = conn.execute(
            "SELECT state, attempt FROM deadman.jobs WHERE id = ANY(%s)", [ids[g.label]]
        ).fetchall()
        got = Counter(str(r[0]) for r in rows)
        attempts = sorted(int(str(r[1])) for r in rows)
        good = got == Counter({g.expect.value: len(g.jobs)})
        ok &= good
        got_s = ", ".join(f"{k}={v}" for k, v in sorted(got.items()))
        att = f"{attempts[0]}-{attempts[-1]}" if attempts else "-"
        print(
            f"{g.label:<28} {g.expect.value:<10} {got_s:<26} {att:<10} "
            f"{'OK' if good else 'UNEXPECTED'}"
        )
    effect_job = ids["side-effect x1"][0]
    row = conn.execute(
        "SELECT count(*) FROM deadman.effects WHERE job_id = %s", [effect_job]
    ).fetchone()
    n_effects = int(str(row[0])) if row else -1
    good = n_effects == 1
    ok &= good
    print(
        f"{'effects for side-effect job':<28} {'1 row':<10} {str(n_effects) + ' row(s)':<26} "
        f"{'':<10} {'OK' if good else 'UNEXPECTED'}"
    )
    late = conn.execute(
        "SELECT count(*) FROM deadman.jobs j WHERE j.id = ANY(%s) AND j.started_at < j.run_at",
        [ids["delayed 2 s x3"]],
    ).fetchone()
    print(f"\ndelayed jobs started before their run_at: {late[0] if late else '?'}")
    print("\nverdict:", "every demo job reached its expected final state" if ok else "FAILED")
    return ok
