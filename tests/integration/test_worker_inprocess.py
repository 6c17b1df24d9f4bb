"""A real Worker, in this process, against a real database.

The worker (tests.helpers.worker) runs its own event loop on a thread; the test thread
enqueues with the Client, waits on database conditions with deadlines, and stops the
worker the way a signal would. The heartbeat is short (0.5 s) so the cancel path
finishes in a second; the lease (10 s) outlasts any stall of a loaded machine, so every
history asserted here is exact.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from deadman.client import Client
from tests.factories import attempt_rows, connect, job_row
from tests.helpers import wait_for
from tests.helpers.worker import (
    FAST_RETRY,
    SETTINGS,
    effects,
    running_worker,
    state_of,
    wait_terminal,
)


@pytest.fixture
def client(db_dsn: str) -> Iterator[Client]:
    with Client(db_dsn, settings=SETTINGS) as c:
        c.get(0)  # build the pool on this thread before anything else uses it
        yield c


def test_handlers_of_every_kind(db_dsn: str, client: Client) -> None:
    jobs = {
        "async": client.enqueue("t.async", {"x": 1}).id,
        "sync": client.enqueue("t.sync").id,
        "effect-async": client.enqueue("t.effect-async").id,
        "effect-sync": client.enqueue("t.effect-sync").id,
        "raise": client.enqueue("t.raise", max_attempts=2, backoff=FAST_RETRY).id,
        "not-json": client.enqueue("t.not-json", max_attempts=1).id,
        "builtin": client.enqueue("noop").id,
        "unknown": client.enqueue("t.nobody-handles-this", max_attempts=1).id,
    }
    with connect(db_dsn) as conn, running_worker(db_dsn) as worker:
        wait_terminal(conn, list(jobs.values()), timeout=8)
        assert worker.stop() == 0
        rows = {k: job_row(conn, v) for k, v in jobs.items()}
        history = {k: [a["outcome"] for a in attempt_rows(conn, v)] for k, v in jobs.items()}

        assert rows["async"]["state"] == "succeeded"
        assert rows["async"]["result"] == {"echo": {"x": 1}, "attempt": 1}
        assert rows["sync"]["result"] == {"thread": True}
        for kind in ("effect-async", "effect-sync"):
            assert rows[kind]["state"] == "succeeded"
            assert effects(conn, jobs[kind]) == 1
            assert history[kind] == ["succeeded"]
        assert rows["effect-async"]["result"] == {"effect": "async"}
        assert rows["effect-sync"]["result"] == {"effect": "sync"}

        assert rows["raise"]["state"] == "dead"
        assert history["raise"] == ["failed", "failed"]
        assert "ValueError: boom on attempt 2" in rows["raise"]["last_error"]

        assert rows["not-json"]["state"] == "dead"
        assert "handler result is not JSON" in rows["not-json"]["last_error"]
        assert history["not-json"] == ["failed"]

        assert rows["builtin"]["state"] == "succeeded"
        assert rows["unknown"]["state"] == "dead"
        assert "no handler registered" in rows["unknown"]["last_error"]

        for kind, job_id in jobs.items():
            attempts = attempt_rows(conn, job_id)
            assert [a["attempt"] for a in attempts] == list(range(1, len(attempts) + 1)), kind
            assert {a["worker"] for a in attempts} == {worker.worker_id}, kind
        leftovers = conn.execute(
            "SELECT count(*) AS n FROM deadman.workers WHERE id = %s", (worker.worker_id,)
        ).fetchone()
        assert leftovers == {"n": 0}  # deregistered on the way out


def test_retries_wait_for_their_backoff(db_dsn: str, client: Client) -> None:
    job_id = client.enqueue("t.flaky", max_attempts=3, backoff=FAST_RETRY).id
    with connect(db_dsn) as conn, running_worker(db_dsn) as worker:
        # The job sits in 'retrying' for at least 400 ms, then 800 ms, between attempts.
        wait_for(lambda: state_of(conn, job_id) == "retrying", timeout=5, message="retrying")
        wait_terminal(conn, [job_id], timeout=8)
        assert worker.stop() == 0
        row = job_row(conn, job_id)
        attempts = attempt_rows(conn, job_id)
    assert row["state"] == "succeeded" and row["result"] == {"succeeded_on": 3}
    assert [a["outcome"] for a in attempts] == ["failed", "failed", "succeeded"]
    # Next attempt started no earlier than the backoff after the failure (same DB clock).
    gap1 = (attempts[1]["started_at"] - attempts[0]["finished_at"]).total_seconds()
    gap2 = (attempts[2]["started_at"] - attempts[1]["finished_at"]).total_seconds()
    assert gap1 >= FAST_RETRY.ceiling_ms(1) / 1000
    assert gap2 >= FAST_RETRY.ceiling_ms(2) / 1000


def test_a_failed_transaction_rolls_its_effect_back(db_dsn: str, client: Client) -> None:
    job_id = client.enqueue("t.effect-then-raise", max_attempts=2, backoff=FAST_RETRY).id
    with connect(db_dsn) as conn, running_worker(db_dsn) as worker:
        wait_terminal(conn, [job_id], timeout=8)
        assert worker.stop() == 0
        assert state_of(conn, job_id) == "dead"
        assert effects(conn, job_id) == 0
        assert [a["outcome"] for a in attempt_rows(conn, job_id)] == ["failed", "failed"]


def test_a_cancel_request_stops_a_running_job(db_dsn: str, client: Client) -> None:
    job_id = client.enqueue("sleep", {"ms": 30_000}).id
    with connect(db_dsn) as conn, running_worker(db_dsn) as worker:
        wait_for(lambda: state_of(conn, job_id) == "running", timeout=5, message="running")
        conn.execute("UPDATE deadman.jobs SET cancel_requested = true WHERE id = %s", (job_id,))
        # a few heartbeats (0.5 s each), nowhere near the 30 s sleep
        wait_for(lambda: state_of(conn, job_id) == "cancelled", timeout=5, message="cancelled")
        assert worker.stop() == 0
        row = job_row(conn, job_id)
        assert row["finished_at"] is not None and row["last_error"] == "cancelled on request"
        assert [a["outcome"] for a in attempt_rows(conn, job_id)] == ["cancelled"]


def test_a_timeout_ends_the_attempt(db_dsn: str, client: Client) -> None:
    job_id = client.enqueue("sleep", {"ms": 30_000}, timeout=0.3, max_attempts=1).id
    with connect(db_dsn) as conn, running_worker(db_dsn) as worker:
        wait_terminal(conn, [job_id], timeout=5)
        assert worker.stop() == 0
        row = job_row(conn, job_id)
        assert row["state"] == "dead"
        assert row["last_error"] == "timed out after 300 ms"
        assert [a["outcome"] for a in attempt_rows(conn, job_id)] == ["timed_out"]


def test_a_job_still_running_at_shutdown_is_released(db_dsn: str, client: Client) -> None:
    job_id = client.enqueue("sleep", {"ms": 30_000}).id
    with connect(db_dsn) as conn, running_worker(db_dsn) as worker:
        wait_for(lambda: state_of(conn, job_id) == "running", timeout=5, message="running")
        assert worker.stop() == 0  # grace 0: released at once
        row = job_row(conn, job_id)
        assert (row["state"], row["attempt"], row["lease_token"]) == ("queued", 0, None)
        assert [a["outcome"] for a in attempt_rows(conn, job_id)] == ["released"]


def test_start_and_stop_three_times(db_dsn: str, client: Client) -> None:
    with connect(db_dsn) as conn:
        seen_workers: set[str] = set()
        for round_ in range(3):
            job_id = client.enqueue("t.async", {"round": round_}).id
            with running_worker(db_dsn) as worker:
                wait_terminal(conn, [job_id], timeout=5)
                assert worker.stop() == 0
                seen_workers.add(worker.worker_id)
            assert state_of(conn, job_id) == "succeeded"
            assert conn.execute("SELECT count(*) AS n FROM deadman.workers").fetchone() == {"n": 0}
            running = conn.execute(
                "SELECT count(*) AS n FROM deadman.jobs WHERE state = 'running'"
            ).fetchone()
            assert running == {"n": 0}
        assert len(seen_workers) == 3


def test_a_nan_result_fails_the_attempt_and_the_worker_survives(
    db_dsn: str, client: Client
) -> None:
    bad = client.enqueue("t.nan", max_attempts=1).id
    with connect(db_dsn) as conn, running_worker(db_dsn) as worker:
        try:
            wait_terminal(conn, [bad], timeout=4)
        finally:
            code = worker.stop(timeout=30)
        assert state_of(conn, bad) == "dead"
        assert code == 0
