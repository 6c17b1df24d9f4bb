"""Handoff at enqueue (DECISIONS 83, migration 0021), statement by statement on a real
Postgres: when an enqueue hands its job to a parked slot, and every case where it must
not (the job then queues exactly as before); what adopt, unpark and the heartbeat do
with the slots; and which callers may hand off at all.

The races between these statements and the rest are rows of the race matrix
(tests/integration/test_race_matrix.py); a real worker process that dies parked is
tests/acceptance/test_handoff_process.py.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg.rows import DictRow

from deadman.client import Client
from deadman.db.queries import QUERIES
from deadman.model import Job
from deadman.store import NewJob, plans
from deadman.store.plan import Query
from deadman.worker.handoff_note import job_from_row, parse_note
from deadman.worker.parking import handoff_channel
from tests.factories import connect, insert_job
from tests.helpers import wait_for

Conn = psycopg.Connection[DictRow]

WORKER = "parker"
QUEUE = "handoff"
TTL_MS = 30_000
#: slot n of park() gets nonce NONCE + n
NONCE = 7_000_000_000


def park(conn: Conn, slots: int = 1, *, worker: str = WORKER, queues: tuple[str, ...] = (QUEUE,),
         first: int = 0, ttl_ms: int = TTL_MS) -> None:  # fmt: skip
    conn.execute(
        QUERIES["worker_park"],
        {
            "worker": worker,
            "queues": list(queues),
            "channel": handoff_channel(worker),
            "ttl_ms": ttl_ms,
            "first": first,
            "nonces": [NONCE + first + k for k in range(slots)],
        },
    )


def enqueue(conn: Conn, *, handoff: bool = True, **params: Any) -> DictRow | None:
    """job_insert_handoff as an enqueue on its own sends it (``handoff=False``:
    job_insert, as inside a caller's transaction); ``params`` override its values."""
    values = NewJob("h.job", queue=QUEUE).params(5)
    values.update(params)
    name = "job_insert_handoff" if handoff else "job_insert"
    return conn.execute(QUERIES[name], values).fetchone()


def parked(conn: Conn, *, closed_too: bool = False) -> list[DictRow]:
    """The open slots (a slot taken back is closed in place: DECISIONS 85); with
    ``closed_too``, every row."""
    where = "" if closed_too else " WHERE open"
    return conn.execute(f"SELECT * FROM deadman.parked{where} ORDER BY worker, slot").fetchall()


def read_job(conn: Conn, job_id: int) -> Job:
    row = conn.execute("SELECT * FROM deadman.jobs WHERE id = %s", (job_id,)).fetchone()
    assert row is not None
    return Job.from_row(row)


def heard(listener: Conn, n: int = 1) -> list[str]:
    """The payloads of the next ``n`` notifications on the parker's channel."""
    notes = list(listener.notifies(timeout=2.0, stop_after=n))
    assert [x.channel for x in notes] == [handoff_channel(WORKER)] * n
    return [x.payload for x in notes]


def test_an_enqueue_on_its_own_hands_its_job_to_a_parked_slot(db_dsn: str) -> None:
    with connect(db_dsn) as conn, connect(db_dsn) as listener:
        listener.execute(f'LISTEN "{handoff_channel(WORKER)}"')
        park(conn)
        job = enqueue(conn)
        assert job is not None
        # born as deadman.job_start would have started it, under the parker's lease
        assert job["state"] == "running"
        assert (job["attempt"], job["lease_worker"]) == (1, WORKER)
        assert job["lease_token"] is not None and job["started_at"] is not None
        left = (job["lease_expires_at"] - job["started_at"]).total_seconds()
        assert left == TTL_MS / 1000
        (slot,) = parked(conn)
        assert (slot["job_id"], slot["lease_token"]) == (job["id"], job["lease_token"])
        # the parker alone is told: the job's id, the slot's nonce, the job (DECISIONS 86)
        notes = [(n.channel, n.payload) for n in listener.notifies(timeout=2.0, stop_after=1)]
        assert [channel for channel, _ in notes] == [handoff_channel(WORKER)]
        note = parse_note(notes[0][1])
        assert note is not None and (note.job_id, note.nonce) == (job["id"], NONCE)
        assert note.row is not None and job_from_row(note.row) == read_job(conn, job["id"])
        # a second enqueue finds no free slot: queued, as without handoffs
        second = enqueue(conn)
        assert second is not None and second["state"] == "queued"
        assert second["lease_token"] is None and second["attempt"] == 0


def _older_due(conn: Conn) -> None:
    insert_job(conn, state="queued", queue=QUEUE, run_in_s=-1)


def _older_retrying(conn: Conn) -> None:
    insert_job(conn, state="retrying", queue=QUEUE, run_in_s=-1)


def _paused(conn: Conn) -> None:
    conn.execute("INSERT INTO deadman.queues (name, paused) VALUES (%s, true)", (QUEUE,))


def _expired_slot(conn: Conn) -> None:
    conn.execute("UPDATE deadman.parked SET expires_at = now() - interval '1 second'")


def _other_queue(conn: Conn) -> None:
    conn.execute("UPDATE deadman.parked SET queues = '{elsewhere}'")


def _nothing(conn: Conn) -> None:
    pass


PAST = datetime(2000, 1, 1, tzinfo=UTC)

#: (what the world holds besides the parked slot, job_insert's overrides, the state the
#: job must be born in)
REFUSALS: dict[str, tuple[Callable[[Conn], None], dict[str, Any], str]] = {
    "inside a caller's transaction": (_nothing, {"handoff": False}, "queued"),
    "an older due job waits": (_older_due, {}, "queued"),
    "an older retrying job is due": (_older_retrying, {}, "queued"),
    "the queue is paused": (_paused, {}, "queued"),
    "keyed (its limit decides)": (_nothing, {"limit_key": "k"}, "queued"),
    "scheduled later": (_nothing, {"delay_ms": 60_000}, "scheduled"),
    "scheduled at a time to come": (
        _nothing,
        {"run_at": datetime(2999, 1, 1, tzinfo=UTC)},
        "scheduled",
    ),
    "past its start_by": (_nothing, {"start_by": PAST}, "queued"),
    "past its deadline": (_nothing, {"deadline": PAST}, "queued"),
    "the slot's worker stopped renewing it": (_expired_slot, {}, "queued"),
    "the slot is for other queues": (_other_queue, {}, "queued"),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_no_handoff_when(db_dsn: str, case: str) -> None:
    world, params, born = REFUSALS[case]
    with connect(db_dsn) as conn:
        park(conn)
        world(conn)
        job = enqueue(conn, **params)
        assert job is not None
        assert (job["state"], job["lease_worker"], job["attempt"]) == (born, None, 0)
        (slot,) = parked(conn)
        assert slot["job_id"] is None, "a slot was taken for a job that was not handed off"


def test_an_older_job_not_yet_due_does_not_hold_a_handoff_back(db_dsn: str) -> None:
    with connect(db_dsn) as conn:
        park(conn)
        insert_job(conn, state="scheduled", queue=QUEUE, run_in_s=60)
        insert_job(conn, state="queued", queue="elsewhere", run_in_s=-1)
        job = enqueue(conn)
        assert job is not None and job["state"] == "running"


def test_a_taken_idempotency_key_inserts_nothing_and_takes_no_slot(db_dsn: str) -> None:
    with connect(db_dsn) as conn:
        held = insert_job(conn, state="succeeded", queue="elsewhere", idempotency_key="k1")
        park(conn)
        assert enqueue(conn, idempotency_key="k1", request_hash="h") is None
        (slot,) = parked(conn)
        assert slot["job_id"] is None
        row = conn.execute("SELECT count(*) AS n FROM deadman.jobs").fetchone()
        assert row is not None and row["n"] == 1 and held.id


def test_two_slots_take_two_jobs_and_a_third_queues(db_dsn: str) -> None:
    with connect(db_dsn) as conn:
        park(conn, 2)
        states = [(enqueue(conn) or {}).get("state") for _ in range(3)]
        assert states == ["running", "running", "queued"]
        assert sorted(s["job_id"] is not None for s in parked(conn)) == [True, True]


def test_adopt_takes_a_handed_row_once_and_only_the_parkers(db_dsn: str) -> None:
    with connect(db_dsn) as conn:
        park(conn)
        job = enqueue(conn)
        assert job is not None
        other = insert_job(conn, state="running", queue=QUEUE, lease_worker="someone-else")
        adopt = QUERIES["job_adopt"]
        # another worker naming the job: not its row
        assert conn.execute(adopt, {"worker": "intruder", "job_id": job["id"]}).fetchall() == []
        # the parker naming a job that was never handed to it (a forged notification)
        assert conn.execute(adopt, {"worker": WORKER, "job_id": other.id}).fetchall() == []
        (row,) = conn.execute(adopt, {"worker": WORKER, "job_id": job["id"]}).fetchall()
        assert (row["slot"], row["id"], row["lease_token"]) == (0, job["id"], job["lease_token"])
        assert 0 < row["lease_left_ms"] <= TTL_MS
        # replayed: the row is gone, nothing is adopted twice
        assert conn.execute(adopt, {"worker": WORKER, "job_id": job["id"]}).fetchall() == []
        assert parked(conn) == []


def test_adopt_gives_the_slot_back_without_a_job_whose_lease_has_lapsed(db_dsn: str) -> None:
    """A handoff the worker learnt of too late (paused past its lease): the rescuer's
    now. The row goes (the slot comes back to the worker); no job is returned."""
    with connect(db_dsn) as conn:
        park(conn)
        job = enqueue(conn)
        assert job is not None
        conn.execute(
            "UPDATE deadman.jobs SET lease_expires_at = now() - interval '1 second' WHERE id = %s",
            (job["id"],),
        )
        (row,) = conn.execute(
            QUERIES["job_adopt"], {"worker": WORKER, "job_id": job["id"]}
        ).fetchall()
        assert (row["slot"], row["id"]) == (0, None)


def test_unpark_returns_every_slot_and_the_jobs_handed_into_them(db_dsn: str) -> None:
    with connect(db_dsn) as conn:
        park(conn, 3)
        park(conn, 1, worker="another")
        job = enqueue(conn)
        assert job is not None
        rows = conn.execute(QUERIES["job_unpark"], {"worker": job["lease_worker"]}).fetchall()
        handed = [r for r in rows if r["job_id"] is not None]
        assert len(rows) == (3 if job["lease_worker"] == WORKER else 1) and len(handed) == 1
        (read,) = conn.execute(
            QUERIES["job_adopt_read"],
            {
                "worker": job["lease_worker"],
                "ids": [handed[0]["job_id"]],
                "tokens": [handed[0]["lease_token"]],
            },
        ).fetchall()
        assert (read["id"], read["state"]) == (job["id"], "running")
        # the other worker's slots are untouched
        assert {r["worker"] for r in parked(conn)} == {WORKER, "another"} - {job["lease_worker"]}


def test_the_heartbeat_keeps_slots_open_and_prune_and_deregister_remove_them(
    db_dsn: str,
) -> None:
    with connect(db_dsn) as conn:
        park(conn, 2)
        park(conn, 1, worker="dead-parker")
        conn.execute("UPDATE deadman.parked SET expires_at = now() - interval '1 hour'")
        conn.execute(
            QUERIES["job_heartbeat_many"],
            {
                "worker": WORKER,
                "hostname": "h",
                "pid": 1,
                "queues": [QUEUE],
                "concurrency": 4,
                "ttl_ms": TTL_MS,
                "ids": [],
                "tokens": [],
            },
        )
        fresh = {r["worker"]: r["expires_at"] > datetime.now(UTC) for r in parked(conn)}
        assert fresh == {WORKER: True, "dead-parker": False}
        conn.execute(QUERIES["worker_prune_stale"], {"older_than_ms": 60_000})
        assert {r["worker"] for r in parked(conn)} == {WORKER}
        conn.execute(QUERIES["worker_deregister"], {"worker": WORKER})
        assert parked(conn) == []


def test_the_client_hands_off_only_outside_the_callers_transaction(db_dsn: str) -> None:
    with connect(db_dsn) as conn, Client(db_dsn) as client:
        park(conn, 2, queues=("default",))
        with psycopg.connect(db_dsn) as theirs, theirs.transaction():
            inside = client.enqueue("h.job", conn=theirs)
        assert inside.state.value == "queued"
        # the job just queued is ahead of the next one: taken by a claim first
        conn.execute("DELETE FROM deadman.jobs")
        own = client.enqueue("h.job")
        assert own.state.value == "running" and own.lease is not None
        assert own.lease.worker == WORKER


def test_a_role_that_may_not_mint_lease_tokens_queues_instead(db_dsn: str) -> None:
    """deadman_api (the API server's role) may not take nextval of the lease token
    sequence (test_api_role.py): its enqueues queue, and fail nothing."""
    with connect(db_dsn) as conn:
        park(conn)
        conn.execute("SET ROLE deadman_api")
        job = enqueue(conn)
        conn.execute("RESET ROLE")
        assert job is not None and job["state"] == "queued"
        assert parked(conn)[0]["job_id"] is None


def test_a_parked_slot_is_taken_before_a_claim_could_see_the_job(db_dsn: str) -> None:
    """The handed job is never also claimable: a claim in its queue right after the
    enqueue finds nothing."""
    with connect(db_dsn) as conn:
        park(conn)
        job = enqueue(conn)
        assert job is not None
        claimed = conn.execute(
            QUERIES["job_claim"],
            {
                "queue": QUEUE,
                "worker": "claimer",
                "limit": 10,
                "ttl_ms": TTL_MS,
                "quarantine_at": 5,
                "keyed": True,
            },
        ).fetchall()
        assert claimed == []


def test_parked_slots_of_a_worker_past_its_ttl_are_ignored_even_before_prune(
    db_dsn: str,
) -> None:
    with connect(db_dsn) as conn:
        park(conn, ttl_ms=1)
        conn.execute("SELECT pg_sleep(0.01)")
        job = enqueue(conn)
        assert job is not None and job["state"] == "queued"
        now = conn.execute("SELECT now() AS t").fetchone()
        assert now is not None and parked(conn)[0]["expires_at"] < now["t"] + timedelta(0)


@pytest.mark.parametrize(
    ("options", "own", "statement"),
    [
        ({}, True, "job_insert_handoff"),
        ({"idempotency_key": "k"}, True, "job_insert_handoff"),
        ({}, False, "job_insert"),
        ({"limit_key": "k"}, True, "job_insert"),
        ({"delay_ms": 1}, True, "job_insert"),
        ({"run_at": PAST}, True, "job_insert"),
        ({"depends_on": (1,)}, True, "job_deps_lock"),
    ],
    ids=[
        "due",
        "idempotency-key",
        "in-callers-transaction",
        "limit-key",
        "delay",
        "run_at",
        "depends_on",
    ],
)
def test_the_plan_sends_only_a_job_that_could_be_handed_off_to_the_handoff_statement(
    options: dict[str, Any], own: bool, statement: str
) -> None:
    """job_insert_handoff for an enqueue on its own of a job it could hand off; the
    plainer job_insert (DECISIONS 84) for the rest, and a job with dependencies takes
    its locks first (then job_insert)."""
    plan = plans.job_insert(NewJob("h.job", **options), 5, handoff=own)
    first = next(plan.steps())
    assert isinstance(first, Query) and first.name == statement


def test_a_slot_taken_back_is_closed_in_place_and_reopened_by_the_next_park(
    db_dsn: str,
) -> None:
    """DECISIONS 85: adopt and unpark close the slot's row, park reopens it; the rows
    are the same two throughout, and a closed row takes no handoff."""
    with connect(db_dsn) as conn:
        park(conn, 2)
        job = enqueue(conn)
        assert job is not None
        conn.execute(QUERIES["job_adopt"], {"worker": WORKER, "job_id": job["id"]})
        assert [(r["slot"], r["open"], r["job_id"]) for r in parked(conn, closed_too=True)] == [
            (0, False, None),
            (1, True, None),
        ]
        conn.execute(QUERIES["job_unpark"], {"worker": WORKER})
        assert [r["open"] for r in parked(conn, closed_too=True)] == [False, False]
        # closed, every slot: the next enqueue queues
        queued = enqueue(conn)
        assert queued is not None and queued["state"] == "queued"
        conn.execute("DELETE FROM deadman.jobs WHERE id = %s", (queued["id"],))
        park(conn, 2)
        assert [(r["slot"], r["open"], r["job_id"]) for r in parked(conn, closed_too=True)] == [
            (0, True, None),
            (1, True, None),
        ]
        again = enqueue(conn)
        assert again is not None and again["state"] == "running"


def test_a_park_never_reopens_a_row_that_still_holds_a_handed_job(db_dsn: str) -> None:
    """A slot the worker no longer counts as parked may still be open in the table (a
    park whose commit it never saw): parking that number again leaves the row, and
    the job handed into it, for an unpark or an adoption to take."""
    with connect(db_dsn) as conn:
        park(conn)
        job = enqueue(conn)
        assert job is not None and job["state"] == "running"
        park(conn, ttl_ms=TTL_MS * 2)
        (row,) = parked(conn, closed_too=True)
        assert (row["open"], row["job_id"]) == (True, job["id"])
        (taken,) = conn.execute(QUERIES["job_unpark"], {"worker": WORKER}).fetchall()
        assert (taken["slot"], taken["job_id"]) == (0, job["id"])


def test_a_busy_parked_worker_leaves_no_dead_rows_behind(db_dsn: str) -> None:
    """Park, hand off, adopt, 500 times over: one row inserted and never deleted, every
    write an update in place (HOT: its old versions are pruned on the page, no VACUUM
    needed). With rows deleted and inserted instead (before DECISIONS 85) each cycle
    left a dead row for VACUUM alone: 1,500 cycles left 6 pages, and a live worker's
    table 42 within 60 s, every page walked by every enqueue's scan for a slot. (How
    soon a page is pruned depends on every transaction in the cluster, so the pages
    themselves are not what is checked: the writes are.)"""
    with connect(db_dsn) as conn:
        for _ in range(500):
            park(conn)
            job = enqueue(conn)
            assert job is not None and job["state"] == "running"
            conn.execute(QUERIES["job_adopt"], {"worker": WORKER, "job_id": job["id"]})
    # a backend's table statistics are flushed when it ends
    stats = (
        "SELECT n_tup_ins, n_tup_del, n_tup_upd FROM pg_stat_user_tables"
        " WHERE relid = 'deadman.parked'::regclass"
    )
    with connect(db_dsn) as conn:
        row = wait_for(
            lambda: (
                (r := conn.execute(stats).fetchone()) is not None and r["n_tup_upd"] >= 1499 and r
            ),
            10,
            message="the loop's statistics",
        )
    assert (row["n_tup_ins"], row["n_tup_del"]) == (1, 0), row


# ---------------------------------------------- the job in the notification (DECISIONS 86)


TRACEPARENT = "00-" + "a" * 32 + "-" + "b" * 16 + "-01"


@pytest.mark.parametrize("timezone", ["UTC", "Asia/Kathmandu", "America/St_Johns"])
def test_the_job_a_notification_carries_is_the_job_the_table_holds(
    db_dsn: str, timezone: str
) -> None:
    """Every column a worker reads, as the claim's read gives it: jsonb through the
    same decoder (a 20-digit integer, a float, unicode, nesting), timestamps in the
    enqueuer's session time zone (offsets of 5:45 and -3:30), keys, deadlines, trace
    context."""
    payload = {"big": 2**70, "f": 0.1, "s": 'zażółć \u2603 \\ "', "nested": [{"a": [1, None]}]}
    with connect(db_dsn) as conn, connect(db_dsn) as listener:
        listener.execute(f'LISTEN "{handoff_channel(WORKER)}"')
        conn.execute(f"SET TIME ZONE '{timezone}'")
        park(conn)
        later = datetime.now(UTC) + timedelta(hours=1)
        job = enqueue(
            conn, payload=psycopg.types.json.Jsonb(payload), priority=-7,
            idempotency_key="k-1", request_hash="h", start_by=later, deadline=later,
            heartbeat_timeout_ms=4_000, timeout_ms=9_000,
            trace_context=psycopg.types.json.Jsonb({"traceparent": TRACEPARENT}),
        )  # fmt: skip
        assert job is not None and job["state"] == "running"
        note = parse_note(heard(listener)[0])
        assert note is not None and note.row is not None
        carried, held = job_from_row(note.row), read_job(conn, job["id"])
        assert carried == held
        assert carried.payload == payload and carried.deadline == later


def test_a_job_too_big_for_a_notification_is_named_by_its_id_alone(db_dsn: str) -> None:
    """NOTIFY refuses a payload of 8,000 bytes or more: the enqueue must not fail, and
    the worker reads the job (job_adopt)."""
    with connect(db_dsn) as conn, connect(db_dsn) as listener:
        listener.execute(f'LISTEN "{handoff_channel(WORKER)}"')
        park(conn, 2)
        for size in (7_000, 8_000):
            job = enqueue(conn, payload=psycopg.types.json.Jsonb({"x": "y" * size}))
            assert job is not None and job["state"] == "running"
            (payload,) = heard(listener)
            if size == 8_000:
                assert payload == str(job["id"])
            else:
                assert len(payload.encode()) < 8_000 and parse_note(payload) is not None
                assert parse_note(payload).row is not None  # type: ignore[union-attr]


def test_a_slot_parked_without_a_nonce_is_told_the_id_alone(db_dsn: str) -> None:
    """A row parked by a worker older than migration 0024 has no nonce."""
    with connect(db_dsn) as conn, connect(db_dsn) as listener:
        listener.execute(f'LISTEN "{handoff_channel(WORKER)}"')
        park(conn)
        conn.execute("UPDATE deadman.parked SET nonce = NULL")
        job = enqueue(conn)
        assert job is not None and job["state"] == "running"
        assert heard(listener) == [str(job["id"])]


def test_each_park_writes_the_nonces_it_is_given_and_a_reopen_replaces_them(
    db_dsn: str,
) -> None:
    with connect(db_dsn) as conn:
        park(conn, 3, first=2)
        assert [(r["slot"], r["nonce"]) for r in parked(conn)] == [
            (2, NONCE + 2), (3, NONCE + 3), (4, NONCE + 4)
        ]  # fmt: skip
        conn.execute(QUERIES["job_unpark"], {"worker": WORKER})
        conn.execute(
            QUERIES["worker_park"],
            {"worker": WORKER, "queues": [QUEUE], "channel": handoff_channel(WORKER),
             "ttl_ms": TTL_MS, "first": 3, "nonces": [11]},
        )  # fmt: skip
        assert [(r["slot"], r["nonce"]) for r in parked(conn)] == [(3, 11)]


def test_handoff_close_closes_only_the_parkers_row_of_that_job_once(db_dsn: str) -> None:
    """job_handoff_close: what job_adopt does to the row, without reading the job."""
    close = QUERIES["job_handoff_close"]
    with connect(db_dsn) as conn:
        park(conn, 2)
        job = enqueue(conn)
        assert job is not None
        other = insert_job(conn, state="running", queue=QUEUE, lease_worker="someone-else")
        assert conn.execute(close, {"worker": "intruder", "job_id": job["id"]}).fetchall() == []
        assert conn.execute(close, {"worker": WORKER, "job_id": other.id}).fetchall() == []
        (row,) = conn.execute(close, {"worker": WORKER, "job_id": job["id"]}).fetchall()
        assert dict(row) == {"slot": 0}
        assert conn.execute(close, {"worker": WORKER, "job_id": job["id"]}).fetchall() == []
        assert [(r["slot"], r["job_id"]) for r in parked(conn)] == [(1, None)]
        (closed,) = [r for r in parked(conn, closed_too=True) if r["slot"] == 0]
        assert (closed["open"], closed["job_id"], closed["lease_token"]) == (False, None, None)
        # the job is untouched: still running under the parker's lease
        held = read_job(conn, job["id"])
        assert held.state.value == "running" and held.lease is not None
        assert held.lease.token == job["lease_token"]


@pytest.mark.parametrize("first", ["close", "unpark"])
def test_handoff_close_and_unpark_take_a_row_once_in_either_order(db_dsn: str, first: str) -> None:
    """The statement that locks the row first takes it; the other waits for it, then
    finds it closed (an unpark returns the slot without it; the close returns nothing)."""
    statements = {
        "close": (QUERIES["job_handoff_close"], {"worker": WORKER}),
        "unpark": (QUERIES["job_unpark"], {"worker": WORKER}),
    }
    with connect(db_dsn) as setup:
        park(setup)
        job = enqueue(setup)
        assert job is not None
    second = "unpark" if first == "close" else "close"
    out: dict[str, list[DictRow]] = {}
    with connect(db_dsn, autocommit=False) as a, connect(db_dsn, autocommit=False) as b:
        query, params = statements[first]
        out[first] = a.execute(query, params | {"job_id": job["id"]}).fetchall()
        waiter_pid = b.info.backend_pid
        done = threading.Event()

        def run_second() -> None:
            query, params = statements[second]
            out[second] = b.execute(query, params | {"job_id": job["id"]}).fetchall()
            b.commit()
            done.set()

        thread = threading.Thread(target=run_second, daemon=True)
        thread.start()
        with connect(db_dsn) as watch:

            def waiting() -> bool:
                row = watch.execute(
                    "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (waiter_pid,)
                ).fetchone()
                return row is not None and row["wait_event_type"] == "Lock"

            wait_for(waiting, 10, message=f"{second} to wait for the row {first} holds")
        assert not done.is_set()
        a.commit()
        thread.join(timeout=10)
        assert done.is_set()
    took = {"close": [r["slot"] for r in out["close"]],
            "unpark": [r["job_id"] for r in out["unpark"] if r["job_id"] is not None]}  # fmt: skip
    if first == "close":
        assert took == {"close": [0], "unpark": []}
    else:
        assert took == {"close": [], "unpark": [job["id"]]}
