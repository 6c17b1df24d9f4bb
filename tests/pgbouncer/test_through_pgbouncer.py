"""Deadman through a real PgBouncer in transaction mode (issue 17, part 2).

Every process here reaches the database through the session's pgbouncer
(tests/pgbouncer/conftest.py) with ``DEADMAN_PREPARE=off``; the listeners either stay
off (``DEADMAN_LISTEN=off``: polling only) or go straight to Postgres
(``DEADMAN_LISTEN_URL``). Worker and API are real processes (tests.helpers.processes);
the checks read the database directly, never through the pooler under test.
"""

from __future__ import annotations

import signal
import threading
import time
from typing import Any

import httpx
import psycopg
import pytest

from deadman import Client
from deadman.config import Settings
from deadman.db.migrate import latest_version, migrate
from deadman.db.plans import generic_plans
from deadman.db.pool import sync_pool
from deadman.db.queries import QUERIES
from deadman.errors import DatabaseUnavailable, translate
from deadman.maintenance import Rescuer, RescueReport
from deadman.model import AttemptOutcome, JobState
from deadman.store import Finish, SyncStore
from tests.factories import async_store, connect, insert_job, run_async
from tests.helpers import wait_for
from tests.helpers.processes import (
    LATE_S,
    START_TIMEOUT_S,
    Spawner,
    SpawnWorker,
    attempts_of,
    job_row,
    sql_all,
    sql_value,
    wait_all_state,
    wait_held,
    wait_registered,
    wait_state,
)
from tests.helpers.worker import SETTINGS, effects, running_worker, wait_terminal
from tests.pgbouncer.bouncer import Bouncer

#: what every process started here is told (the README's "behind PgBouncer" settings)
BEHIND: dict[str, str | float | int] = {"DEADMAN_PREPARE": "off", "DEADMAN_LISTEN": "off"}

pytestmark = pytest.mark.usefixtures("through_pgbouncer")

#: the statements prepared on the server connection a statement runs on
PREPARED = "SELECT name FROM pg_prepared_statements ORDER BY name"


def _listening(dsn: str) -> list[dict[str, Any]]:
    """The sessions of this database that listen (their last statement a LISTEN)."""
    return sql_all(
        dsn,
        "SELECT pid, client_port, query FROM pg_stat_activity"
        " WHERE datname = current_database() AND query LIKE 'LISTEN %'",
    )


# ------------------------------------------------------------ prepared statements


@pytest.mark.parametrize("prepare", ["on", "off"])
def test_prepared_statements_collide_on_a_shared_server_connection_unless_off(
    single_dsn: str, monkeypatch: pytest.MonkeyPatch, prepare: str
) -> None:
    """Two clients behind one server connection (PgBouncer < 1.21 has no protocol-level
    prepared statements): with psycopg's default each prepares its fifth-run statement
    as ``_pg3_0`` on that server connection, and the second is refused. Off, nothing is
    prepared and both go on."""
    monkeypatch.setenv("DEADMAN_PREPARE", prepare)
    with Client(single_dsn) as a, Client(single_dsn) as b:
        job_id = a.enqueue("noop").id

        def reads() -> None:
            for _ in range(20):  # a pool hands out its connections in turn
                assert a.get(job_id) is not None
                assert b.get(job_id) is not None

        if prepare == "on":
            with pytest.raises(Exception, match="prepared statement"):
                reads()
        else:
            reads()
    # what the prepared run left on the one server connection would meet the next
    # client there: session state outlives its client behind a transaction pooler
    with psycopg.connect(single_dsn, autocommit=True, prepare_threshold=None) as conn:
        conn.execute("DEALLOCATE ALL")


def test_the_generic_plan_option_is_not_sent_with_prepare_off(bouncer_dsn: str) -> None:
    """The worker's pool asks for generic plans by a startup option (deadman/db/plans.py),
    which PgBouncer 1.18 refuses outright; it only governs prepared statements, so with
    DEADMAN_PREPARE=off it is not sent."""
    assert generic_plans(bouncer_dsn) == bouncer_dsn
    with pytest.raises(psycopg.OperationalError, match="unsupported startup parameter"):
        psycopg.connect(generic_plans(bouncer_dsn, prepare=True)).close()


def test_an_explicit_prepare_is_not_prepared_with_prepare_off(single_dsn: str) -> None:
    """``execute(..., prepare=True)`` follows DEADMAN_PREPARE=off too (psycopg refuses
    every prepare when the threshold is None): nothing is left on the shared server
    connection for the other client to collide with."""
    with sync_pool(single_dsn, name="a", min_size=1) as a, sync_pool(single_dsn, name="b") as b:
        for _ in range(3):
            for pool in (a, b):
                with pool.connection() as conn:
                    before = conn.execute(PREPARED).fetchall()
                    conn.execute("SELECT 1", prepare=True)
                    assert conn.execute(PREPARED).fetchall() == before


# ------------------------------------------------------------------ workers


def test_a_worker_polling_only_runs_what_the_client_enqueues(
    db_dsn: str, bouncer_dsn: str, spawn_worker: SpawnWorker
) -> None:
    worker = spawn_worker(bouncer_dsn, DEADMAN_PREPARE="off", DEADMAN_LISTEN="off")
    wait_registered(db_dsn, worker.pid)
    worker.wait_event("listener_off", 5)
    with Client(bouncer_dsn) as client:
        ids = [client.enqueue("noop").id for _ in range(20)]
        ids += client.enqueue_many([client.job("noop", {"i": i}) for i in range(200)])
    wait_all_state(db_dsn, ids, "succeeded", timeout=30)
    assert _listening(db_dsn) == []  # nobody LISTENs (it would be lost in the pooler)
    attempts = sql_value(
        db_dsn, "SELECT count(*) FROM deadman.attempts WHERE job_id = ANY(%s)", (ids,)
    )
    assert attempts == len(ids)  # each ran once


def test_a_worker_listening_on_a_direct_url_wakes_at_once(
    db_dsn: str, bouncer_dsn: str, spawn_worker: SpawnWorker
) -> None:
    """Its statements through PgBouncer, its LISTEN straight to Postgres: a job enqueued
    through PgBouncer starts at once, not at the next poll (30 s away)."""
    worker = spawn_worker(
        bouncer_dsn, DEADMAN_PREPARE="off", DEADMAN_LISTEN_URL=db_dsn, DEADMAN_POLL_S=30
    )
    wait_registered(db_dsn, worker.pid)
    wait_for(lambda: _listening(db_dsn), 10, message="the worker to LISTEN")
    with Client(bouncer_dsn) as client:
        job_id = client.enqueue("noop").id
    row = wait_state(db_dsn, job_id, "succeeded", timeout=LATE_S)
    assert row["attempt"] == 1


def test_a_sigkilled_workers_jobs_are_rescued_through_pgbouncer(
    db_dsn: str, bouncer_dsn: str, spawn_worker: SpawnWorker
) -> None:
    victim = spawn_worker(bouncer_dsn, no_rescuer=True, DEADMAN_PREPARE="off", DEADMAN_LISTEN="off")
    victim_id = wait_registered(db_dsn, victim.pid)
    with Client(bouncer_dsn) as client:
        ids = [client.enqueue("sleep", {"ms": 3000}).id for _ in range(3)]
    for job_id in ids:
        wait_held(db_dsn, job_id, victim_id)
    victim.send(signal.SIGKILL)
    victim.wait_exit(10)
    # its leases lapse (2 s) while the heir starts; the heir's rescuer hands the jobs
    # on and the heir runs them, through PgBouncer like everything else they do
    heir = spawn_worker(bouncer_dsn, DEADMAN_PREPARE="off", DEADMAN_LISTEN="off")
    heir_id = wait_registered(db_dsn, heir.pid)
    wait_all_state(db_dsn, ids, "succeeded", timeout=START_TIMEOUT_S)
    for job_id in ids:
        assert job_row(db_dsn, job_id)["rescues"] == 1
        last = attempts_of(db_dsn, job_id)[-1]
        assert (last["outcome"], last["worker"]) == ("succeeded", heir_id)


# --------------------------------------------------------------------- API


def test_the_api_submits_and_reads_jobs_through_pgbouncer(
    db_dsn: str, bouncer_dsn: str, spawn_worker: SpawnWorker, _spawner: Spawner
) -> None:
    port = _free_port()
    api = _spawner.start(
        ["serve", "--port", str(port), "--database-url", bouncer_dsn], "api", BEHIND
    )
    spawn_worker(bouncer_dsn, DEADMAN_PREPARE="off", DEADMAN_LISTEN="off")
    base = f"http://127.0.0.1:{port}"
    wait_for(lambda: _ready(base, api.poll()), START_TIMEOUT_S, message="the API to be ready")
    r = httpx.post(f"{base}/jobs", json={"type": "noop", "payload": {"via": "pgbouncer"}})
    assert r.status_code == 201, r.text
    job_id = r.json()["id"]
    r = httpx.get(f"{base}/jobs/{job_id}")
    assert (r.status_code, r.json()["id"]) == (200, job_id)
    # a long-poll with listening off: answered by the API's polls (every second)
    r = httpx.get(f"{base}/jobs/{job_id}", params={"wait_ms": 20_000}, timeout=30)
    assert (r.status_code, r.json()["state"]) == (200, "succeeded")
    assert job_row(db_dsn, job_id)["payload"] == {"via": "pgbouncer"}


def _free_port() -> int:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ready(base: str, exited: int | None) -> bool:
    assert exited is None, f"deadman serve exited {exited}"
    try:
        return httpx.get(f"{base}/ready", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


# --------------------------------------------------------------- migrations


def test_migrations_run_through_pgbouncer(
    empty_db_dsn: str, pgbouncer: Bouncer, _spawner: Spawner
) -> None:
    through = pgbouncer.dsn(empty_db_dsn)
    cli = _spawner.start(["migrate", "--database-url", through], "migrate", BEHIND)
    assert cli.wait_exit(START_TIMEOUT_S) == 0, cli.tail()
    assert sql_value(empty_db_dsn, "SELECT max(version) FROM deadman.schema_migrations") == (
        latest_version()
    )
    assert migrate(through) == []  # again, in this process: nothing left to apply


# ---------------------------------------------- handlers' transactions, bulk enqueue


def test_ctx_transaction_effects_are_exactly_once_through_pgbouncer(
    db_dsn: str, bouncer_dsn: str
) -> None:
    """The effect and the fenced completion in one transaction of the handler's pool,
    through PgBouncer: written once per job, and not at all when the handler fails."""
    with running_worker(bouncer_dsn, SETTINGS), Client(bouncer_dsn) as client:
        ids = [client.enqueue(t).id for t in ("t.effect-async", "t.effect-sync") * 5]
        failing = client.enqueue("t.effect-then-raise", max_attempts=1).id
        with connect(db_dsn) as conn:
            wait_terminal(conn, [*ids, failing], timeout=30)
            assert [effects(conn, i) for i in ids] == [1] * len(ids)
            assert effects(conn, failing) == 0
    assert all(job_row(db_dsn, i)["state"] == "succeeded" for i in ids)
    assert job_row(db_dsn, failing)["state"] == "dead"


def test_enqueue_many_stages_per_transaction_through_pgbouncer(
    bouncer_dsn: str, single_dsn: str
) -> None:
    """COPY into pg_temp.deadman_stage: the table is created (if this server
    connection has none yet) and emptied in the enqueue's own transaction, so batches
    from clients that share a server connection (one, on single_dsn) or come in
    parallel never see each other's rows."""
    with Client(single_dsn) as a, Client(single_dsn) as b:
        first = a.enqueue_many([a.job("noop", {"i": i}) for i in range(50)])
        second = b.enqueue_many([b.job("noop", {"i": i}) for i in range(70)])
        assert (len(first), len(second), len(set(first) | set(second))) == (50, 70, 120)

    made: list[list[int]] = []

    def batches(client: Client) -> None:
        for _ in range(3):
            made.append(client.enqueue_many([client.job("noop") for _ in range(300)]))

    with Client(bouncer_dsn) as client:
        threads = [threading.Thread(target=batches, args=(client,)) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        # two in one transaction of the caller's: the second sees none of the first's
        with psycopg.connect(bouncer_dsn) as conn:
            one = client.enqueue_many([client.job("noop") for _ in range(5)], conn=conn)
            two = client.enqueue_many([client.job("noop") for _ in range(7)], conn=conn)
    assert [len(ids) for ids in made] == [300] * 9
    assert (len(one), len(two)) == (5, 7)
    every = [i for ids in made for i in ids] + one + two
    assert len(set(every)) == len(every) == 2712


# ------------------------------------------------------- idle-in-transaction limits


def _tick(dsn: str) -> RescueReport:
    async def main() -> RescueReport:
        async with async_store(dsn) as store:
            return await Rescuer(store, Settings()).tick()

    return run_async(main)


def test_a_paused_handler_transaction_is_ended_through_pgbouncer(
    db_dsn: str, bouncer_dsn: str
) -> None:
    """The fenced completion arms the idle limit with set_config(..., true): local to
    the transaction, so it holds through PgBouncer, and the server ends the paused
    session (PgBouncer then drops its client), which lets the job go to the rescuer."""
    with connect(db_dsn) as conn:
        job = insert_job(conn, state="running", lease_expires_in_s=-10)
    assert job.lease_token is not None
    finish = Finish(job.id, job.lease_token, JobState.SUCCEEDED, AttemptOutcome.SUCCEEDED)
    with psycopg.connect(bouncer_dsn) as paused:  # a transaction left open, as if frozen
        assert SyncStore().job_succeed_in(paused, finish, idle_ms=300)
        assert _tick(bouncer_dsn).requeued == []  # locked: the rescuer passes over it
        wait_for(lambda: _tick(bouncer_dsn).requeued == [job.id], 10, message="the rescue")
        with pytest.raises(DatabaseUnavailable), translate():
            paused.execute("SELECT 1")  # it wakes: its session is gone
    row = job_row(db_dsn, job.id)
    assert (row["state"], row["rescues"]) == ("queued", 1)


def test_a_paused_rescuer_leader_loses_its_lock_through_pgbouncer(
    db_dsn: str, bouncer_dsn: str
) -> None:
    with connect(db_dsn) as conn:
        job_id = insert_job(conn, state="running", lease_expires_in_s=-10).id
    started = time.monotonic()
    with psycopg.connect(bouncer_dsn) as paused:
        row = paused.execute(QUERIES["rescuer_try_lock"], {"key": 2, "idle_ms": 300}).fetchone()
        assert row is not None and row[0] is True
        assert not _tick(bouncer_dsn).leader  # held: nobody else may rescue
        wait_for(lambda: _tick(bouncer_dsn).leader, 10, message="leadership to come back")
        with pytest.raises(DatabaseUnavailable), translate():
            paused.execute("SELECT 1")
    assert time.monotonic() - started < 10
    assert job_row(db_dsn, job_id)["state"] == "queued"
