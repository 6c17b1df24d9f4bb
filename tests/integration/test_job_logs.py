"""Every job event a worker logs carries the job's id, type, queue, attempt, lease
token and worker: a real Worker in this process, logging JSON lines into a buffer."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from typing import Any

import pytest
import structlog

from deadman import logs
from deadman.client import Client
from deadman.model import Backoff
from tests.factories import connect, insert_job, job_row
from tests.helpers import wait_for
from tests.helpers.worker import SETTINGS, running_worker


@pytest.fixture
def json_logs() -> Iterator[io.StringIO]:
    buf = io.StringIO()
    logs.configure("json", "debug", stream=buf, cache=False)
    try:
        yield buf
    finally:
        structlog.reset_defaults()


def events(buf: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in buf.getvalue().splitlines() if line.startswith("{")]


def test_job_events_carry_the_job_and_lease_fields(db_dsn: str, json_logs: io.StringIO) -> None:
    with connect(db_dsn) as conn:
        # a job whose worker vanished: its lease lapsed 10 s ago, the rescuer hands it on
        lapsed = insert_job(conn, state="running", type="t.async", lease_expires_in_s=-10)
    with Client(db_dsn, settings=SETTINGS) as client:
        ok = client.enqueue("t.async", {"n": 1}).id
        bad = client.enqueue("t.raise", max_attempts=1, backoff=Backoff(base_ms=0, max_ms=0)).id
        with running_worker(db_dsn) as worker, connect(db_dsn) as conn:
            wait_for(
                lambda: all(
                    job_row(conn, i)["state"] in ("succeeded", "dead") for i in (ok, bad, lapsed.id)
                ),
                timeout=20,
                message="jobs to finish",
            )
            worker_id = worker.worker_id
    seen = events(json_logs)
    job_events = [e for e in seen if "job_id" in e]
    names = {e["event"] for e in job_events}
    assert {"job_started", "job_finished", "job_rescued"} <= names, names
    for e in job_events:
        missing = [f for f in logs.JOB_FIELDS if f not in e]
        assert not missing, (e["event"], missing, e)
        assert e["timestamp"].endswith("Z") and e["level"]
    finished = {e["job_id"]: e for e in job_events if e["event"] == "job_finished"}
    assert finished[ok]["worker"] == worker_id and finished[ok]["type"] == "t.async"
    assert finished[bad]["state"] == "dead" and finished[bad]["attempt"] == 1
    (rescued,) = [e for e in job_events if e["event"] == "job_rescued"]
    assert rescued["job_id"] == lapsed.id and rescued["lease_token"] == lapsed.lease_token
    assert rescued["worker"] == "factory-worker"  # whose lease lapsed
