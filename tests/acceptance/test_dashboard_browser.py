"""The dashboard in real headless Chromium: ``deadman serve`` and a worker as real
processes, a job that dies, then a person signs in, opens the dead letters, clicks
Replay and watches the job succeed, then signs out. Takes a screenshot of the
queues page into the test's tmp directory (a test never writes a tracked file: to
refresh README's docs/dashboard.png, copy it from there by hand).

Needs Debian's chromium (``make browser-deps``) and the ``playwright`` package (dev
extra; its own browser download is never used). Without them the browser test fails
under CI=true and skips, saying why, on a developer machine (``make browser-deps``
can only apt-get it as root). The same flow without the browser — real processes,
real Postgres, the dashboard's forms posted over HTTP — runs everywhere, so the skip
hides the rendering only, never a database behaviour.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers import wait_for
from tests.helpers.processes import SpawnWorker, sql_all, wait_state

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
REPO = Path(__file__).resolve().parents[2]
TOKEN = "browser-test-token"


def _missing(reason: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{reason} (CI must have it: `make browser-deps`, dev extra)")
    pytest.skip(f"{reason}: run `make browser-deps` and install the dev extra")


@pytest.fixture
def browser() -> Iterator[Any]:
    if not CHROMIUM.exists():
        _missing(f"{CHROMIUM} is not installed")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing("the playwright package is not installed")
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def server(db_dsn: str, tmp_path: Path) -> Iterator[str]:
    port = _free_port()
    env = dict(os.environ, DEADMAN_API_TOKEN=TOKEN, DEADMAN_LOG_FORMAT="json")
    log = (tmp_path / "serve.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "deadman", "serve", "--port", str(port), "--database-url", db_dsn],
        env=env,
        cwd=REPO,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        try:
            return httpx.get(f"{url}/health", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_for(ready, timeout=30, message="deadman serve to answer /health")
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)
        log.close()


def _dead_job(db_dsn: str, server: str, spawn_worker: SpawnWorker) -> int:
    """A job that died on its only attempt, through the real API and a real worker;
    its cause is then fixed, so a replay runs a handler that succeeds."""
    spawn_worker(db_dsn, app=None, name="worker")
    made = httpx.post(
        f"{server}/jobs",
        json={"type": "fail", "payload": {"message": "upstream said no"}, "max_attempts": 1},
        headers={"Authorization": f"Bearer {TOKEN}"},
        timeout=10,
    )
    assert made.status_code == 201, made.text
    job_id = int(made.json()["id"])
    wait_state(db_dsn, job_id, "dead", timeout=30)
    sql_all(db_dsn, "UPDATE deadman.jobs SET type = 'noop' WHERE id = %s", (job_id,))
    return job_id


def test_replay_a_dead_job_through_the_dashboard_forms(
    db_dsn: str, server: str, spawn_worker: SpawnWorker
) -> None:
    """The browser test's flow without a browser: sign in, see the dead job and its
    error, post its replay form, and the worker runs it to success."""
    job_id = _dead_job(db_dsn, server, spawn_worker)
    origin = {"Origin": server}
    with httpx.Client(base_url=server, timeout=10) as c:
        assert c.get("/ui/dead").headers.get("location", "").endswith("/ui/login")
        signed = c.post("/ui/login", data={"token": TOKEN}, headers=origin)
        assert signed.status_code == 303, signed.text
        dead = c.get("/ui/dead")
        assert f'href="/ui/jobs/{job_id}"' in dead.text and "upstream said no" in dead.text
        replay = c.post(f"/ui/jobs/{job_id}/retry", headers=origin)
        assert replay.status_code == 303 and replay.headers["location"] == f"/ui/jobs/{job_id}"
        out = c.post("/ui/logout", headers=origin)
        assert out.status_code == 303 and out.headers["location"] == "/ui/login"
        assert c.get("/ui/dead").headers.get("location", "").endswith("/ui/login")
    wait_state(db_dsn, job_id, "succeeded", timeout=30)


def test_replay_a_dead_job_from_the_dashboard(
    db_dsn: str, server: str, spawn_worker: SpawnWorker, browser: Any, tmp_path: Path
) -> None:
    job_id = _dead_job(db_dsn, server, spawn_worker)

    page = browser.new_page(viewport={"width": 1280, "height": 800})
    page.goto(f"{server}/ui/dead")
    assert page.url.endswith("/ui/login")  # not signed in yet
    page.fill("input[name=token]", TOKEN)
    page.click("button[type=submit]")
    page.wait_for_url(f"{server}/ui/")
    page.goto(f"{server}/ui/dead")
    row = page.locator("tr", has=page.locator(f'a[href="/ui/jobs/{job_id}"]'))
    assert "upstream said no" in row.inner_text()
    row.locator("button", has_text="replay").click()
    page.wait_for_url(f"{server}/ui/jobs/{job_id}")
    # the job page refreshes itself until the worker has run the replay
    page.locator("main td .state-succeeded").first.wait_for(timeout=30_000)
    assert "succeeded" in page.locator("main").inner_text()
    wait_state(db_dsn, job_id, "succeeded", timeout=5)

    page.goto(f"{server}/ui/")
    page.locator("main table").first.wait_for()
    screenshot = tmp_path / "dashboard.png"
    page.screenshot(path=str(screenshot), full_page=True)
    assert screenshot.stat().st_size > 10_000

    page.click("button:has-text('sign out')")
    page.wait_for_url(f"{server}/ui/login")
    page.goto(f"{server}/ui/dead")
    assert page.url.endswith("/ui/login")  # the session is gone from this browser
