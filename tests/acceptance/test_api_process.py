"""``deadman serve`` as a real process: jobs submitted with Idempotency-Key while the
server is stopped (SIGTERM, then SIGKILL) and started again mid-run. Every request
the client saw acknowledged is in the database exactly once, under the id it was
given; requests cut off by a restart are retried with their key and create nothing
twice. Also: its access log, its event loop setting, its stack dump, and its loop's
watch.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import httpx
import psycopg
import pytest

from deadman.stackdump import request_dump
from tests.helpers import wait_for
from tests.helpers.processes import log_events, process_state

JOBS = 150
SERVE = [sys.executable, "-m", "deadman", "serve"]
START_TIMEOUT_S = 30.0


def _at_least(acked: dict[str, str], n: int) -> bool:
    return len(acked) >= n


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """One ``deadman serve`` process at a time on a fixed port; logs to a file."""

    def __init__(self, dsn: str, port: int, log: Path) -> None:
        self.dsn, self.port, self.log = dsn, port, log
        self.env: dict[str, str] = {}  # more DEADMAN_* for the next start
        self.proc: subprocess.Popen[bytes] | None = None
        self.last = ""  # the last answer to a readiness probe, for failure messages

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        env = dict(os.environ, DEADMAN_LOG_FORMAT="json", DEADMAN_SHUTDOWN_GRACE_S="5")
        env.pop("DEADMAN_API_TOKEN", None)
        env.update(self.env)
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [*SERVE, "--port", str(self.port), "--database-url", self.dsn],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            wait_for(self._healthy, timeout=START_TIMEOUT_S, message="deadman serve to answer")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; last answer: {self.last}; log: {self.tail()}") from None

    def _healthy(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"deadman serve exited {self.proc.returncode}: {self.tail()}")
        try:
            r = httpx.get(self.url + "/ready", timeout=2)
        except httpx.HTTPError as exc:
            self.last = repr(exc)
            return False
        self.last = f"{r.status_code} {r.text}"
        return r.status_code == 200

    def stop(self, sig: signal.Signals) -> int:
        assert self.proc is not None
        self.proc.send_signal(sig)
        code = self.proc.wait(timeout=30)
        self.proc = None
        return code

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""


@pytest.fixture
def server(db_dsn: str, tmp_path: Path) -> Iterator[Server]:
    srv = Server(db_dsn, _free_port(), tmp_path / "serve.log")
    try:
        yield srv
    finally:
        srv.kill()


def test_restarts_lose_nothing_acknowledged(server: Server, db_dsn: str) -> None:
    server.start()
    acked: dict[str, str] = {}  # key -> id the client was given
    retried = 0
    lock = threading.Lock()
    done = threading.Event()
    abort = threading.Event()

    def submit_all() -> None:
        nonlocal retried
        with httpx.Client(base_url=server.url, timeout=10) as c:
            for i in range(JOBS):
                key = f"job-{i}"
                body = {"type": "noop", "payload": {"i": i}}
                while not abort.is_set():  # retry with the same key until acknowledged
                    try:
                        r = c.post("/jobs", json=body, headers={"Idempotency-Key": key})
                    except httpx.TransportError:
                        r = None
                    if r is not None and r.status_code in (200, 201):
                        with lock:
                            acked[key] = r.json()["id"]
                        break
                    assert r is None or r.status_code == 503, r.text
                    retried += 1
                    abort.wait(0.05)  # back off briefly, as Retry-After asks
        done.set()

    submitter = threading.Thread(target=submit_all, daemon=True)
    submitter.start()
    try:
        for sig, after in ((signal.SIGTERM, JOBS // 3), (signal.SIGKILL, 2 * JOBS // 3)):
            wait_for(partial(_at_least, acked, after), timeout=60, message="submissions")
            code = server.stop(sig)
            if sig is signal.SIGTERM:
                # uvicorn finishes the requests in flight, runs the lifespan shutdown
                # (the pool closes), then re-raises the signal it caught
                assert code in (0, -signal.SIGTERM), server.tail()
                assert "Application shutdown complete" in server.tail()
            server.start()
        submitter.join(timeout=120)
        assert done.is_set(), "the submitter did not finish"
    finally:
        abort.set()
        submitter.join(timeout=15)

    assert len(acked) == JOBS
    assert retried > 0, "no request hit a restart: the test proved nothing"
    with psycopg.connect(db_dsn) as conn:
        rows = conn.execute("SELECT idempotency_key, id FROM deadman.jobs").fetchall()
    stored = {str(k): str(i) for k, i in rows}
    assert len(rows) == JOBS, "a retried submission was created twice"
    assert stored == acked, "an acknowledged job is missing or has another id"
    # after the restarts, every key still replays to the job it made
    with httpx.Client(base_url=server.url, timeout=10) as c:
        for key in ("job-0", f"job-{JOBS // 2}", f"job-{JOBS - 1}"):
            i = int(key.split("-")[1])
            r = c.post(
                "/jobs",
                json={"type": "noop", "payload": {"i": i}},
                headers={"Idempotency-Key": key},
            )
            assert (r.status_code, r.json()["id"]) == (200, acked[key])
    assert server.stop(signal.SIGTERM) in (0, -signal.SIGTERM)


def _posted(server: Server, n: int) -> None:
    with httpx.Client(base_url=server.url, timeout=10) as c:
        for i in range(n):
            assert c.post("/jobs", json={"type": "noop", "payload": {"i": i}}).status_code == 201


def test_the_access_log_is_off_unless_asked_for(server: Server) -> None:
    """DEADMAN_ACCESS_LOG (DECISIONS 74): no line per request by default; uvicorn's
    line per request with it on. Started both ways on uvloop and on asyncio's loop, with
    the tuned collector and with Python's own (DEADMAN_GC)."""
    request_line = '"POST /jobs HTTP/1.1" 201'
    for loop in ("uvloop", "asyncio"):
        server.env = {"DEADMAN_EVENT_LOOP": loop}
        server.start()
        _posted(server, 3)
        assert server.stop(signal.SIGTERM) in (0, -signal.SIGTERM)
        assert request_line not in server.tail(), loop
        assert '"policy": "tuned"' in server.tail(), server.tail()
        server.env = {
            "DEADMAN_EVENT_LOOP": loop,
            "DEADMAN_ACCESS_LOG": "on",
            "DEADMAN_GC": "python",  # Python's own collector on this run
        }
        server.log.write_bytes(b"")
        server.start()
        _posted(server, 3)
        assert server.stop(signal.SIGTERM) in (0, -signal.SIGTERM)
        assert server.tail().count(request_line) == 3, (loop, server.tail())
        assert '"policy": "python"' in server.tail(), server.tail()
        server.log.write_bytes(b"")


def test_a_bad_event_loop_setting_stops_serve_at_start(db_dsn: str) -> None:
    env = dict(os.environ, DEADMAN_EVENT_LOOP="trio")
    out = subprocess.run(
        [*SERVE, "--port", str(_free_port()), "--database-url", db_dsn],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2, out
    assert "DEADMAN_EVENT_LOOP must be auto, uvloop or asyncio" in out.stderr
    assert "Traceback" not in out.stderr


def test_sigusr1_dumps_the_servers_threads_and_it_keeps_serving(server: Server) -> None:
    """``kill -USR1`` on ``deadman serve``: every thread's stack in its log, and the
    server goes on answering (SIGUSR1 used to end it: the default action), a burst of
    twenty signals included."""
    server.start()
    assert server.proc is not None
    assert "Current thread" in request_dump(server.proc.pid, server.log, timeout=10)
    for _ in range(20):
        server.proc.send_signal(signal.SIGUSR1)
    r = httpx.post(server.url + "/jobs", json={"type": "noop"}, timeout=10)
    assert r.status_code == 201, r.text
    assert server.proc.poll() is None
    assert server.stop(signal.SIGTERM) in (0, -signal.SIGTERM)


def test_a_frozen_server_says_how_long_its_loop_stood_still(server: Server) -> None:
    """``deadman serve`` watches its event loop (deadman.loopwatch): stopped long
    enough that a request times out, then continued, it logs how long its loop stood
    still and counts it in its /metrics, and answers again."""
    server.start()
    assert server.proc is not None
    pid = server.proc.pid
    server.proc.send_signal(signal.SIGSTOP)
    stopped = time.monotonic()
    wait_for(lambda: process_state(pid) == "T", 5, message="serve to stop")
    with pytest.raises(httpx.TimeoutException):  # nobody answers while it is stopped
        httpx.get(server.url + "/health", timeout=1.0)
    frozen_ms = (time.monotonic() - stopped) * 1000
    server.proc.send_signal(signal.SIGCONT)

    wait_for(  # the freeze's, not a shorter stall
        lambda: any(
            e["blocked_ms"] >= frozen_ms - 500
            for e in log_events(server.log.read_text(errors="replace"), "event_loop_blocked_for")
        ),
        5,
        message=f"serve to log its loop's {frozen_ms:.0f} ms standstill",
    )
    r = httpx.get(server.url + "/metrics", timeout=10)  # observed with the log line
    assert r.status_code == 200, r.text
    (count,) = [
        float(line.split()[-1])
        for line in r.text.splitlines()
        if line.startswith("deadman_event_loop_blocked_seconds_count ")
    ]
    assert count >= 1, r.text[-2000:]
    assert server.stop(signal.SIGTERM) in (0, -signal.SIGTERM)
