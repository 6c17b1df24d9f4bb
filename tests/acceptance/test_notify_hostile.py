"""Hostile NOTIFYs against a real worker process.

NOTIFY needs no privilege: any role that can connect, the read-only
``deadman_reader`` included, can send anything on the channels every worker listens
to. A malformed notification must be logged (rate-limited) and ignored; the
listener must never die of its input, and the worker must keep processing jobs.
"""

from __future__ import annotations

import psycopg
import pytest

from deadman.client import Client
from deadman.worker.listener import CANCEL_CHANNEL, CHANNEL
from tests.helpers.processes import SpawnWorker, wait_registered, wait_state

pytestmark = pytest.mark.slow

#: Postgres refuses payloads of 8000 bytes or more; this is the largest it takes.
MAX_PAYLOAD = "x" * 7999

HOSTILE = [
    "²",  # str.isdigit() is true, int() refuses it
    "١٢٣",  # Arabic-Indic digits: int() takes them, they name no job of ours
    "-1",
    "0",
    " 7",
    "7\n",
    "9" * 7999,  # more digits than int() converts by default, and far past bigint
    "99999999999999999999",  # past bigint
    "",
    MAX_PAYLOAD,
    "no-such-queue",
    "default ",
    "".join(chr(c) for c in range(1, 0x800) if not 0xD800 <= c <= 0xDFFF)[:2000],
]


def notify_all(dsn: str, payloads: list[str], *, role: str | None = None) -> None:
    """Send every payload on every channel a worker listens to, in one session."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        if role is not None:
            conn.execute(f"SET ROLE {role}")  # a fixed test role name, not input
        for channel in (CHANNEL, CANCEL_CHANNEL):
            for payload in payloads:
                conn.execute("SELECT pg_notify(%s, %s)", (channel, payload))


def test_hostile_notifications_are_ignored_and_the_worker_keeps_working(
    db_dsn: str, spawn_worker: SpawnWorker
) -> None:
    # A 30 s poll: a job that starts within seconds after the flood proves the
    # listener itself survived (only its NOTIFY can wake the idle producer).
    worker = spawn_worker(db_dsn, concurrency=2, DEADMAN_POLL_S=30)
    wait_registered(db_dsn, worker.pid)
    with Client(db_dsn) as client:
        for role in (None, "deadman_reader"):
            notify_all(db_dsn, HOSTILE, role=role)
            job = client.enqueue("noop")
            row = wait_state(db_dsn, job.id, "succeeded", timeout=10)
            assert (row["started_at"] - row["created_at"]).total_seconds() < 5.0
            assert worker.poll() is None, "the worker died of a notification"
    ignored = worker.events("notification_ignored")
    assert ignored, "a malformed notification must be logged"
    assert all(e["channel"] == CANCEL_CHANNEL for e in ignored)
    # the log line shows the payload cut short, never 8000 bytes of it
    assert all(len(e["payload"]) <= 100 for e in ignored)
    assert not worker.events("listener_crashed")


def test_a_flood_of_bad_cancels_is_logged_at_a_bounded_rate(
    db_dsn: str, spawn_worker: SpawnWorker
) -> None:
    worker = spawn_worker(db_dsn, concurrency=2, DEADMAN_POLL_S=30)
    wait_registered(db_dsn, worker.pid)
    with Client(db_dsn) as client:
        # Registered is not yet listening: a flood sent before the listener's LISTEN
        # is heard by nobody (seen once in a full suite: 0 lines logged). With a 30 s
        # poll, a job enqueued now finishes in time only through the listener, whose
        # wake-ups all come after its LISTEN.
        first = client.enqueue("noop")
        wait_state(db_dsn, first.id, "succeeded", timeout=15)
    flood = 3000
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("SET ROLE deadman_reader")
        conn.execute(
            # distinct payloads: Postgres folds identical ones of one transaction into one
            "SELECT pg_notify(%s, '²' || g) FROM generate_series(1, %s) AS g",
            (CANCEL_CHANNEL, flood),
        )
    with Client(db_dsn) as client:
        job = client.enqueue("noop")  # queued behind the flood on the same connection
        wait_state(db_dsn, job.id, "succeeded", timeout=15)
    assert worker.poll() is None
    ignored = worker.events("notification_ignored")
    # A handful of lines, not 3000: the disk is not the sender's to fill (the count
    # of what was left out is logged once the rate window closes).
    assert 1 <= len(ignored) <= 20
