"""Graceful shutdown of a real worker process: SIGTERM drains what fits in the grace
period and releases the rest (no attempt used up); a second signal exits at once and
leaves the held jobs to the rescuer."""

from __future__ import annotations

import signal
import time

import pytest

from deadman.client import Client
from tests.helpers import wait_for
from tests.helpers.processes import (
    LATE_S,
    STEADY_TTL_S,
    TTL_S,
    SpawnWorker,
    attempts_of,
    install_transition_log,
    job_row,
    sql_all,
    sql_value,
    states_of,
    transitions,
    wait_all_state,
    wait_held,
    wait_registered,
)

pytestmark = pytest.mark.slow

GRACE_S = 2.0


def wait_all_held(dsn: str, ids: list[int], worker_id: str, timeout: float = 10) -> None:
    wait_for(
        lambda: (
            sql_value(
                dsn,
                "SELECT count(*) FROM deadman.jobs"
                " WHERE id = ANY(%s) AND state = 'running' AND lease_worker = %s",
                (ids, worker_id),
            )
            == len(ids)
        ),
        timeout,
        message=f"{worker_id} to hold jobs {ids}",
    )


def test_sigterm_finishes_short_jobs_and_releases_long_ones(
    db_dsn: str, spawn_worker: SpawnWorker
) -> None:
    install_transition_log(db_dsn)
    # The leases must hold through the grace: a rescue would be a second run.
    worker = spawn_worker(
        db_dsn,
        concurrency=6,
        DEADMAN_SHUTDOWN_GRACE_S=GRACE_S,
        DEADMAN_LEASE_TTL_S=STEADY_TTL_S,
    )
    worker_id = wait_registered(db_dsn, worker.pid)
    with Client(db_dsn) as client:
        short = [client.enqueue("sleep", {"ms": 800}).id for _ in range(2)]
        long_async = [client.enqueue("sleep", {"ms": 60_000}).id for _ in range(2)]
        # A sync handler cannot be interrupted: released all the same, and its late
        # effect (if the process lived long enough to write it) would be refused.
        long_sync = [client.enqueue("side-effect", {"sleep_ms": 60_000}).id]
    long = long_async + long_sync
    wait_all_held(db_dsn, short + long, worker_id)
    # Idle on a 30 s poll: only the release's NOTIFY can wake it in time.
    successor = spawn_worker(
        db_dsn,
        concurrency=6,
        name="successor",
        DEADMAN_POLL_S=30,
        DEADMAN_LEASE_TTL_S=STEADY_TTL_S,
    )
    successor_id = wait_registered(db_dsn, successor.pid)

    worker.send(signal.SIGTERM)
    sent = time.monotonic()
    code = worker.wait_exit(GRACE_S + 2 * LATE_S)
    exit_s = time.monotonic() - sent
    print(f"SIGTERM with jobs longer than the {GRACE_S}s grace: exit {code} after {exit_s:.2f}s")
    assert code == 0
    # It waited the whole grace for the long ones, and not much longer.
    assert GRACE_S - 0.1 <= exit_s < GRACE_S + LATE_S

    for job_id in short:
        assert [(a["outcome"], a["attempt"]) for a in attempts_of(db_dsn, job_id)] == [
            ("succeeded", 1)
        ]
        assert job_row(db_dsn, job_id)["state"] == "succeeded"
    # The long ones went back to 'queued' with the attempt given back, and the idle
    # successor, woken by the release's NOTIFY, claimed them as attempt 1 again.
    for job_id in long:
        wait_held(db_dsn, job_id, successor_id, timeout=2 * LATE_S)
        released, reclaimed = transitions(db_dsn, job_id)[-2:]
        assert (released["old_state"], released["new_state"], released["attempt"]) == (
            "running",
            "queued",
            0,
        )
        assert (reclaimed["new_state"], reclaimed["attempt"]) == ("running", 1)
        assert (reclaimed["at"] - released["at"]).total_seconds() < LATE_S  # not the poll
        assert [(a["outcome"], a["attempt"]) for a in attempts_of(db_dsn, job_id)] == [
            ("released", 1)
        ]
    # None lost, none run twice, no effect from the interrupted sync handler.
    assert states_of(db_dsn, short + long) == {"succeeded": 2, "running": 3}
    assert sql_value(db_dsn, "SELECT count(*) FROM deadman.effects") == 0
    assert [r["id"] for r in sql_all(db_dsn, "SELECT id FROM deadman.workers")] == [successor_id], (
        "the stopped worker deregistered"
    )


def test_second_signal_exits_at_once_and_jobs_are_rescued(
    db_dsn: str, spawn_worker: SpawnWorker
) -> None:
    worker = spawn_worker(db_dsn, DEADMAN_SHUTDOWN_GRACE_S=60)
    worker_id = wait_registered(db_dsn, worker.pid)
    with Client(db_dsn) as client:
        ids = [client.enqueue("sleep", {"ms": 2500}).id for _ in range(2)]
        ids.append(client.enqueue("side-effect", {"sleep_ms": 2500}).id)
    wait_all_held(db_dsn, ids, worker_id)
    tokens = {j: job_row(db_dsn, j)["lease_token"] for j in ids}

    worker.send(signal.SIGTERM)
    # The first signal must have been handled (draining) before the second is sent;
    # two pending SIGTERMs would merge into one.
    worker.wait_event("worker_draining", 5)
    worker.send(signal.SIGINT)
    sent = time.monotonic()
    code = worker.wait_exit(2 * LATE_S)
    exit_s = time.monotonic() - sent
    print(f"second signal: exit {code} after {exit_s:.2f}s")
    assert code != 0
    assert exit_s < LATE_S  # not the 60 s grace

    # It left without a word: the jobs are still running under its leases ...
    for job_id in ids:
        row = job_row(db_dsn, job_id)
        assert (row["state"], row["lease_token"]) == ("running", tokens[job_id])
    # ... until they lapse and another worker's rescuer hands them on.
    other = spawn_worker(db_dsn, name="other")
    other_id = wait_registered(db_dsn, other.pid)
    for job_id in ids:
        wait_held(db_dsn, job_id, other_id, timeout=TTL_S + 10)
    wait_all_state(db_dsn, ids, "succeeded", timeout=10)
    for job_id in ids:
        assert [(a["outcome"], a["worker"]) for a in attempts_of(db_dsn, job_id)] == [
            ("lease_expired", worker_id),
            ("succeeded", other_id),
        ]
    assert sql_all(db_dsn, "SELECT job_id, count(*) AS n FROM deadman.effects GROUP BY job_id") == [
        {"job_id": ids[2], "n": 1}
    ]
