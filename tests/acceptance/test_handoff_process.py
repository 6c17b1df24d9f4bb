"""Handoffs at enqueue (DECISIONS 83, 86) with real worker processes: a worker that dies
parked does not lose the job handed to it, a handed job starts from its notification,
and a worker's own handoff channel, which anyone who can connect may NOTIFY (or
LISTEN on), runs nothing it was not handed."""

from __future__ import annotations

import json
import signal
from typing import Any

import psycopg
import pytest

from deadman.client import Client
from deadman.worker.handoff_note import parse_note
from deadman.worker.parking import handoff_channel
from tests.acceptance.test_notify_hostile import HOSTILE
from tests.factories import connect, insert_job
from tests.helpers import wait_for
from tests.helpers.processes import (
    LATE_S,
    RESCUE_S,
    STEADY_TTL_S,
    TTL_S,
    Proc,
    SpawnWorker,
    attempts_of,
    job_row,
    sql_all,
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


def test_a_handed_job_starts_from_its_note_and_a_replayed_or_forged_note_runs_nothing(
    db_dsn: str, spawn_worker: SpawnWorker
) -> None:
    """DECISIONS 86. A spy LISTENing on the worker's channel sees a genuine note (the
    job, the slot's nonce); sending it again, or sending a note with a spent or guessed
    nonce that claims another worker's running job is ours, runs nothing: each is only
    an id, and job_adopt finds no row of ours holding it. (A TTL long enough that a
    slot parked at start is still fresh when the test enqueues.)"""
    worker = spawn_worker(
        db_dsn, concurrency=2, DEADMAN_POLL_S=30, DEADMAN_LEASE_TTL_S=STEADY_TTL_S
    )
    worker_id = wait_registered(db_dsn, worker.pid)
    channel = handoff_channel(worker_id)
    with psycopg.connect(db_dsn, autocommit=True) as spy:
        spy.execute(f'LISTEN "{channel}"')
        wait_for(lambda: parked_slots(db_dsn, worker_id) == 2, 10, message="the worker to park")
        with Client(db_dsn) as client:
            job = client.enqueue("noop")
        assert job.lease is not None and job.lease.worker == worker_id, "not handed off"
        wait_state(db_dsn, job.id, "succeeded", timeout=LATE_S)
        (genuine,) = [n.payload for n in spy.notifies(timeout=2.0, stop_after=1)]
    note = parse_note(genuine)
    assert note is not None and note.nonce is not None and note.row is not None
    with connect(db_dsn) as conn:
        elsewhere = insert_job(conn, state="running", type="noop", lease_worker="someone-else")
        claimed = conn.execute("SELECT * FROM deadman.jobs WHERE id = %s", (elsewhere.id,))
        row = claimed.fetchone()
    assert row is not None
    forged_row = json.dumps(
        {k: (v.isoformat() if hasattr(v, "isoformat") else v) for k, v in row.items()}
        | {"lease_worker": worker_id}
    )
    forged = [
        genuine,  # replayed
        f"{elsewhere.id} {note.nonce} {forged_row}",  # a spent nonce
        f"{elsewhere.id} {note.nonce ^ 1} {forged_row}",  # a guessed one
        # malformed after a real id: each is that id, read from the table
        f"{elsewhere.id} {note.nonce} {{not json",
        f"{elsewhere.id} {note.nonce} []",
        f"{elsewhere.id} -1 {forged_row}",
        f"{elsewhere.id} {'9' * 40} {forged_row}",
        f"{elsewhere.id} {note.nonce} {forged_row[:-1]}" + " " * (7_900 - len(forged_row)),
    ]
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("SET ROLE deadman_reader")
        for payload in forged:
            conn.execute("SELECT pg_notify(%s, %s)", (channel, payload))
    with Client(db_dsn) as client:
        after = client.enqueue("noop")
    wait_state(db_dsn, after.id, "succeeded", timeout=LATE_S)
    worker.send(signal.SIGTERM)
    assert worker.wait_exit(LATE_S) == 0
    (stopped,) = worker.events("worker_stopped")
    assert stopped["handed_from_note"] >= 1, stopped
    assert [a["outcome"] for a in attempts_of(db_dsn, job.id)] == ["succeeded"]
    assert job_row(db_dsn, elsewhere.id)["lease_worker"] == "someone-else"
    for event in ("job_outcome_refused", "job_abandoned_lease_lost", "job_reclaimed_while_held"):
        assert not worker.events(event), event


def nonces(dsn: str, worker: str) -> set[int]:
    rows = sql_all(dsn, "SELECT nonce FROM deadman.parked WHERE worker = %s AND open", (worker,))
    return {int(r["nonce"]) for r in rows}


def _wait_parked_again(dsn: str, worker_id: str, times: int = 3) -> None:
    """Until the worker's two slots have been parked afresh (new nonces) ``times``."""
    seen = [nonces(dsn, worker_id)]

    def parked_again() -> bool:
        now = nonces(dsn, worker_id)
        if len(now) == 2 and now != seen[-1]:
            seen.append(now)
        return len(seen) > times

    wait_for(parked_again, 10 * TTL_S, interval=0.05, message=f"{times} parks afresh")


def _hand_one_and_stop(dsn: str, worker: Proc, worker_id: str) -> dict[str, Any]:
    """Enqueue one job, handed to the worker, wait for it, stop the worker; its
    worker_stopped event."""
    with Client(dsn) as client:
        job = client.enqueue("noop")
    assert job.lease is not None and job.lease.worker == worker_id, "not handed off"
    wait_state(dsn, job.id, "succeeded", timeout=LATE_S)
    worker.send(signal.SIGTERM)
    assert worker.wait_exit(LATE_S) == 0
    (stopped,) = worker.events("worker_stopped")
    return stopped


def test_an_idle_workers_slots_are_parked_again_before_they_go_stale(
    db_dsn: str, spawn_worker: SpawnWorker
) -> None:
    """A job handed into a slot parked longer ago than half the trust window (here
    2 s TTL: 0.75 s) would be read first (job_adopt); an idle worker parks its slots
    again (new nonces) before that, so a job handed to it after a long idle still
    starts from its notification."""
    worker = spawn_worker(db_dsn, concurrency=2, DEADMAN_POLL_S=30)
    worker_id = wait_registered(db_dsn, worker.pid)
    wait_for(lambda: parked_slots(db_dsn, worker_id) == 2, 10, message="the worker to park")
    _wait_parked_again(db_dsn, worker_id)  # three times over, each well inside the poll
    stopped = _hand_one_and_stop(db_dsn, worker, worker_id)
    assert (stopped["handed"], stopped["handed_from_note"]) == (1, 1), stopped
    # Parking afresh is not a claim: an idle worker claims at its start and at its
    # poll (30 s here), not each time its parked slots go stale (DECISIONS 96).
    assert stopped["claims"] <= 2, stopped


#: a trigger that makes every park take longer than a parked slot stays fresh (half
#: the 2 s test trust window, minus its margin)
SLOW_PARK = """
CREATE FUNCTION slow_park() RETURNS trigger LANGUAGE plpgsql AS
$$ BEGIN PERFORM pg_sleep(1.2); RETURN NULL; END $$;
CREATE TRIGGER slow_park BEFORE INSERT ON deadman.parked
FOR EACH STATEMENT EXECUTE FUNCTION slow_park();
"""


def test_parks_slower_than_a_slot_stays_fresh_send_no_claims(
    db_dsn: str, spawn_worker: SpawnWorker
) -> None:
    """A loaded database can take longer to park slots than they stay fresh. The idle
    worker used to end its wait on slots stale at once and send an empty claim round
    for every such park (a whole-suite run counted 3 claims in the test above); it now
    waits as long as a fresh park lasts, and a job handed into its stale slots still
    runs."""
    worker = spawn_worker(db_dsn, concurrency=2, DEADMAN_POLL_S=30)
    worker_id = wait_registered(db_dsn, worker.pid)
    wait_for(lambda: parked_slots(db_dsn, worker_id) == 2, 10, message="the worker to park")
    with connect(db_dsn) as conn:
        conn.execute(SLOW_PARK)
    _wait_parked_again(db_dsn, worker_id)  # three slow parks
    stopped = _hand_one_and_stop(db_dsn, worker, worker_id)
    assert stopped["handed"] == 1, stopped
    assert stopped["claims"] <= 2, stopped
