"""Handoffs at enqueue (DECISIONS 83) with real worker processes: a worker that dies
parked does not lose the job handed to it, and a worker's own handoff channel, which
anyone who can connect may NOTIFY, runs nothing it was not handed."""

from __future__ import annotations

import signal

import psycopg
import pytest

from deadman.client import Client
from deadman.worker.parking import handoff_channel
from tests.acceptance.test_notify_hostile import HOSTILE
from tests.factories import connect, insert_job
from tests.helpers import wait_for
from tests.helpers.processes import (
    LATE_S,
    RESCUE_S,
    TTL_S,
    SpawnWorker,
    attempts_of,
    job_row,
    sql_value,
    wait_registered,
    wait_state,
)

pytestmark = pytest.mark.slow


def parked_slots(dsn: str, worker: str) -> int:
    return int(
        sql_value(
            dsn,
            "SELECT count(*) FROM deadman.parked WHERE worker = %s AND open AND job_id IS NULL",
            (worker,),
        )
    )


def test_a_job_handed_to_a_worker_that_died_parked_is_rescued_and_runs(
    db_dsn: str, spawn_worker: SpawnWorker
) -> None:
    victim = spawn_worker(db_dsn, name="victim", concurrency=2, DEADMAN_POLL_S=30)
    victim_id = wait_registered(db_dsn, victim.pid)
    wait_for(lambda: parked_slots(db_dsn, victim_id) == 2, 10, message="the victim to park")
    victim.send(signal.SIGKILL)
    assert victim.wait_exit(5) == -signal.SIGKILL
    # Its slots are still open (nothing renews them now, and they lapse with its TTL):
    # the enqueue hands the job to the dead worker.
    with Client(db_dsn) as client:
        job = client.enqueue("noop")
    assert (job.state.value, job.lease.worker if job.lease else None) == ("running", victim_id)
    survivor = spawn_worker(db_dsn, name="survivor", concurrency=2, DEADMAN_POLL_S=30)
    survivor_id = wait_registered(db_dsn, survivor.pid)
    # the lease lapses, the survivor's rescuer puts the job back, the survivor runs it
    row = wait_state(db_dsn, job.id, "succeeded", timeout=TTL_S + RESCUE_S + 2 * LATE_S)
    lost, won = attempts_of(db_dsn, job.id)
    assert (lost["outcome"], lost["worker"]) == ("lease_expired", victim_id)
    assert (won["outcome"], won["worker"]) == ("succeeded", survivor_id)
    assert row["rescues"] == 1
    # the dead worker's slots lapsed: later jobs go to the survivor's (or queue)
    with Client(db_dsn) as client:
        later = client.enqueue("noop")
    assert later.lease is None or later.lease.worker == survivor_id
    wait_state(db_dsn, later.id, "succeeded", timeout=LATE_S)


def test_forged_notifications_on_a_workers_channel_run_nothing(
    db_dsn: str, spawn_worker: SpawnWorker
) -> None:
    """Anyone who can connect may NOTIFY the worker's own channel. Garbage is logged
    and ignored; the id of a real job that was not handed to it (another worker's
    running job, a queued job of a queue it does not serve) is not run, because only
    an enqueue's handoff fills a slot row of its (job_adopt). The worker keeps taking
    handoffs afterwards."""
    worker = spawn_worker(db_dsn, concurrency=2, DEADMAN_POLL_S=30)
    worker_id = wait_registered(db_dsn, worker.pid)
    wait_for(lambda: parked_slots(db_dsn, worker_id) == 2, 10, message="the worker to park")
    with connect(db_dsn) as conn:
        elsewhere = insert_job(conn, state="running", type="noop", lease_worker="someone-else")
        unserved = insert_job(conn, state="queued", type="noop", queue="unserved", run_in_s=-1)
    forged = [*HOSTILE, str(elsewhere.id), str(unserved.id)]
    channel = handoff_channel(worker_id)
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        for role in (None, "deadman_reader"):
            if role is not None:
                conn.execute("SET ROLE deadman_reader")
            for payload in forged:
                conn.execute("SELECT pg_notify(%s, %s)", (channel, payload))
    with Client(db_dsn) as client:
        job = client.enqueue("noop")
    assert job.lease is not None and job.lease.worker == worker_id, "not handed off"
    wait_state(db_dsn, job.id, "succeeded", timeout=LATE_S)
    for forged_job, state, attempt in ((elsewhere, "running", 1), (unserved, "queued", 0)):
        row = job_row(db_dsn, forged_job.id)
        assert (row["state"], row["attempt"], row["lease_worker"]) == (
            state,
            attempt,
            "someone-else" if state == "running" else None,
        )
    assert worker.poll() is None, "the worker died of a notification"
    ignored = worker.events("notification_ignored")
    assert ignored and {e["channel"] for e in ignored} == {channel}
    assert all(len(e["payload"]) <= 100 for e in ignored)
    assert not worker.events("listener_crashed")
