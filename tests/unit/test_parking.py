"""The worker's slot accounting around handoffs (deadman.worker.parking): whatever
order the database answers park, unpark and adopt in, every parked slot comes back
exactly once, to the claims or to the job handed into it; never twice (the worker
would run more handlers than its slots) and never not at all (a slot lost for good).

The statements themselves run on Postgres in tests/integration/test_handoff.py and
the race matrix; here a store answers as Postgres would in each interleaving, so that
the interleaving is the test's to choose."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest

from deadman.config import Settings
from deadman.errors import DatabaseUnavailable
from deadman.model import Job, JobState
from deadman.store.handoffs import Adopted, Park, Unparked
from deadman.worker.inflight import Inflight
from deadman.worker.parking import Parking, handoff_channel
from deadman.worker.parts import WorkerParts
from deadman.worker.slots import Slots

SETTINGS = Settings(concurrency=4, handoff_slots=4, lease_ttl_s=10.0, heartbeat_s=2.0)


def job(job_id: int) -> Job:
    now = datetime.now(UTC)
    return Job.from_row(
        {
            "id": job_id,
            "type": "t",
            "queue": "default",
            "priority": 0,
            "state": JobState.RUNNING.value,
            "attempt": 1,
            "max_attempts": 5,
            "run_at": now,
            "created_at": now,
        }
    )


class Store:
    """Answers as Postgres would for the interleaving the test sets up."""

    def __init__(self) -> None:
        self.rows: dict[int, int | None] = {}  # slot -> job handed into it
        self.nonces: dict[int, int] = {}  # slot -> the nonce its last park wrote
        self.fail_park = False
        #: adopt (or a close) waits on this before it answers (one under way)
        self.adopt_gate: asyncio.Event | None = None
        self.adopts = 0  # job_adopt calls (a job started from its note needs none)

    async def worker_park(self, p: Park) -> None:
        if self.fail_park:
            raise DatabaseUnavailable("park lost")
        for slot, nonce in enumerate(p.nonces, start=p.first):
            self.rows[slot] = None
            self.nonces[slot] = nonce

    async def job_unpark(self, worker: str) -> list[Unparked]:
        out = [Unparked(s, j, None if j is None else 7) for s, j in self.rows.items()]
        self.rows.clear()
        return out

    async def job_adopt(self, worker: str, job_id: int) -> tuple[int | None, Adopted | None]:
        self.adopts += 1
        slot = await self.job_handoff_close(worker, job_id)
        return (None, None) if slot is None else (slot, Adopted(job(job_id), 9_000))

    async def job_handoff_close(self, worker: str, job_id: int) -> int | None:
        found = [s for s, j in self.rows.items() if j == job_id]
        if not found:
            return None
        del self.rows[found[0]]  # the row is taken now; the answer may come later
        if self.adopt_gate is not None:
            await self.adopt_gate.wait()
        return found[0]

    async def job_adopt_read(self, worker: str, handed: Sequence[Unparked]) -> list[Adopted]:
        return [Adopted(job(u.job_id), 9_000) for u in handed if u.job_id is not None]


class Executor:
    def __init__(self, slots: Slots) -> None:
        self.slots = slots
        self.started: list[int] = []

    def start(self, j: Job, claimed_at: float) -> None:
        self.slots.take()
        self.started.append(j.id)


def parking(settings: Settings = SETTINGS) -> tuple[Parking, Store, Slots, Executor]:
    slots = Slots(settings.concurrency)
    store, executor = Store(), Executor(slots)
    parts = WorkerParts(
        store=store,  # type: ignore[arg-type]
        settings=settings,
        inflight=Inflight(),
        executor=executor,  # type: ignore[arg-type]
        worker_id="w",
        queues=["default"],
    )
    return Parking(parts, slots), store, slots, executor


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_park_reserves_free_slots_up_to_the_target_and_unpark_gives_them_back() -> None:
    async def main() -> None:
        p, store, slots, _ = parking()
        slots.take()  # one job running
        await p.park()
        assert (p.parked, slots.free(), len(store.rows)) == (3, 0, 3)
        await p.unpark()
        assert (p.parked, slots.free(), store.rows) == (0, 3, {})

    run(main())


def test_a_handed_job_takes_over_its_slot() -> None:
    async def main() -> None:
        p, store, slots, executor = parking()
        await p.park()
        store.rows[1] = 42  # an enqueue handed job 42 into slot 1
        p.handed(42)
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert executor.started == [42]
        assert (p.parked, slots.used) == (3, 4)
        p.handed(42)  # replayed: the row is gone
        await asyncio.sleep(0)
        assert executor.started == [42] and slots.used == 4

    run(main())


def test_unpark_starts_the_jobs_whose_notifications_were_lost() -> None:
    async def main() -> None:
        p, store, slots, executor = parking()
        await p.park()
        store.rows[0], store.rows[2] = 5, 6
        await p.unpark()
        assert sorted(executor.started) == [5, 6]
        assert (p.parked, slots.used) == (0, 2)

    run(main())


def test_an_adoption_under_way_settles_its_own_slot_while_unpark_runs() -> None:
    """The notification's adopt took slot 1's row before the unpark's DELETE, and
    answers after it: the unpark must not give slot 1 back as well."""

    async def main() -> None:
        p, store, slots, executor = parking()
        await p.park()
        store.rows[1] = 42
        store.adopt_gate = asyncio.Event()
        p.handed(42)
        await asyncio.sleep(0)  # adopt has taken the row, not answered
        unpark = asyncio.create_task(p.unpark())
        await asyncio.sleep(0)
        assert not unpark.done(), "unpark must wait for the adoption under way"
        store.adopt_gate.set()
        await unpark
        assert executor.started == [42]
        assert (p.parked, slots.used) == (0, 1), "a slot given back twice or lost"

    run(main())


def test_a_park_whose_outcome_is_unknown_comes_back_at_the_next_unpark() -> None:
    async def main() -> None:
        p, store, slots, _ = parking()
        store.fail_park = True
        await p.park()
        assert (p.parked, slots.free()) == (4, 0)  # reserved: the rows may exist
        await p.unpark()
        assert (p.parked, slots.free()) == (0, 4)

    run(main())


@pytest.mark.parametrize("left_ms", [0, 1_000, 2_000])
def test_a_handoff_with_no_more_lease_than_the_margin_is_not_started(left_ms: int) -> None:
    async def main() -> None:
        p, store, slots, executor = parking()
        await p.park()
        store.rows[0] = 8

        async def adopt(worker: str, job_id: int) -> tuple[int | None, Adopted | None]:
            del store.rows[0]
            return 0, Adopted(job(8), left_ms)

        store.job_adopt = adopt  # type: ignore[method-assign]
        p.handed(8)
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert executor.started == [] and slots.used == 3  # its slot is back

    assert SETTINGS.lease_margin_s == 2.0
    run(main())


def test_a_listener_that_reconnects_while_slots_are_parked_asks_for_an_unpark() -> None:
    """Notifications sent while the listener was away are lost: its reconnect marks
    the parked slots for an unpark (the producer's next round), which finds every job
    handed meanwhile."""

    async def main() -> None:
        p, store, slots, executor = parking()
        p.heard()  # nothing parked: nothing to find
        assert not p.resync
        await p.park()
        store.rows[3] = 77  # handed while the listener was away: no notification
        p.heard()
        assert p.resync
        await p.unpark()
        assert (p.resync, executor.started, slots.used) == (False, [77], 1)

    run(main())


def test_no_handoffs_without_a_listener() -> None:
    p, *_ = parking(replace(SETTINGS, listen=False))
    assert p.target == 0 and not p.short()


def test_the_channel_is_a_short_identifier_of_its_own_per_worker() -> None:
    long_id = "host-" + "x" * 300
    a, b = handoff_channel(long_id), handoff_channel(long_id + "y")
    assert a != b and len(a.encode()) <= 63 and a.isidentifier()


# ------------------------------------------------------------ started from the note
# DECISIONS 86: the enqueue's notification carries the job and the slot's nonce.


def handoff(store: Store, slot: int, job_id: int, *, worker: str = "w", **row: Any) -> str:
    """An enqueue hands ``job_id`` into ``slot`` (the fake row) and returns the payload
    job_insert_handoff sends: id, the slot's nonce, the row as row_to_json writes it."""
    store.rows[slot] = job_id
    now = datetime.now(UTC).isoformat()
    values = {
        "id": job_id, "type": "t", "queue": "default", "priority": 0, "state": "running",
        "attempt": 1, "max_attempts": 5, "run_at": now, "created_at": now,
        "payload": {"n": job_id}, "backoff": {}, "lease_token": 70 + job_id,
        "lease_worker": worker, "lease_expires_at": now, "started_at": now, "woke": None,
    } | row  # fmt: skip
    return f"{job_id} {store.nonces[slot]} {json.dumps(values)}"


async def turns(n: int = 3) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


def test_a_noted_job_starts_before_its_row_is_closed_and_only_once() -> None:
    async def main() -> None:
        p, store, slots, executor = parking()
        await p.park()
        store.adopt_gate = asyncio.Event()  # job_handoff_close has not answered
        note = handoff(store, 1, 42)
        assert p.noted(note)
        assert executor.started == [42], "started from the note, not after job_adopt"
        assert (p.parked, slots.used) == (3, 4)
        store.adopt_gate.set()
        await turns()
        assert 1 not in store.rows, "job_handoff_close closed the row behind it"
        assert store.adopts == 0, "the job was read back although the note carried it"
        assert p.noted(note)  # replayed: its nonce is spent; job_adopt finds no row
        await turns()
        assert executor.started == [42] and slots.used == 4
        slots.give()  # job 42 ends: slot 1 is parked again, with a new nonce
        await p.park()
        assert store.nonces[1] != int(note.split()[1]) and store.rows[1] is None
        assert (p.parked, slots.used) == (4, 4)

    run(main())


def test_an_unpark_that_closes_a_noted_row_first_does_not_start_its_job_again() -> None:
    async def main() -> None:
        p, store, slots, executor = parking()
        await p.park()
        store.adopt_gate = asyncio.Event()
        note = handoff(store, 2, 9)

        async def close_later(worker: str, job_id: int) -> int | None:
            assert store.adopt_gate is not None
            await store.adopt_gate.wait()
            return None  # the unpark closed the row first

        store.job_handoff_close = close_later  # type: ignore[method-assign]
        assert p.noted(note)
        unpark = asyncio.create_task(p.unpark())
        await turns()
        store.adopt_gate.set()
        await unpark
        assert executor.started == [9], "the unpark found the row and started it again"
        assert (p.parked, slots.used) == (0, 1)
        await p.park()
        assert p.parked == 3  # slot 2's number is free again, and every slot counted

    run(main())


@pytest.mark.parametrize(
    "case", ["wrong nonce", "other worker", "not running",
             "other id", "unreadable", "id alone", "parked long ago"],
)  # fmt: skip
def test_a_note_that_cannot_be_trusted_is_only_an_id(case: str, monkeypatch: Any) -> None:
    """Each is read from the table (job_adopt): the fake answers as Postgres would, with
    the job only if an enqueue handed it into one of our rows."""

    async def main() -> None:
        p, store, slots, executor = parking()
        await p.park()
        note = handoff(store, 0, 5)
        job_id, nonce, row = note.split(" ", 2)
        if case == "wrong nonce":
            note = f"{job_id} {int(nonce) ^ 1} {row}"
        elif case == "other worker":
            note = handoff(store, 0, 5, worker="someone-else")
        elif case == "not running":
            note = handoff(store, 0, 5, state="queued")
        elif case == "other id":
            note = f"{job_id} {nonce} {json.dumps(json.loads(row) | {'id': 6})}"
        elif case == "unreadable":
            note = f"{job_id} {nonce} {json.dumps({'id': 5})}"
        elif case == "id alone":
            note = job_id
        elif case == "parked long ago":
            later = time.monotonic() + 5.0  # parked 5 s ago: past half the 8-s trust window
            monkeypatch.setattr(time, "monotonic", lambda: later)
        store.adopt_gate = asyncio.Event()
        assert p.noted(note)
        assert executor.started == [], "started without reading the job"
        store.adopt_gate.set()
        await turns()
        assert executor.started == [5]  # as the table says: handed into slot 0
        assert (p.parked, slots.used) == (3, 4)

    run(main())


@pytest.mark.parametrize("payload", ["", "x", "-5", "05", " 5", "5x 1 {}", "9" * 30])
def test_a_payload_that_names_no_job_is_refused(payload: str) -> None:
    async def main() -> None:
        p, store, _, executor = parking()
        await p.park()
        assert not p.noted(payload)
        await turns()
        assert executor.started == [] and all(j is None for j in store.rows.values())

    run(main())


def test_parked_slots_go_stale_after_half_the_trust_window(monkeypatch: Any) -> None:
    """Trust window: TTL 10 s less the 2 s margin; a slot parked 4 s ago or more is
    stale (the producer parks it again), and a note into it is only an id."""

    async def main() -> None:
        p, store, _, executor = parking()
        assert p.fresh_for() == float("inf") and not p.stale()  # nothing parked
        await p.park()
        assert 3.9 < p.fresh_for() <= 4.0 and not p.stale()
        now = time.monotonic()
        monkeypatch.setattr(time, "monotonic", lambda: now + 4.01)
        assert p.fresh_for() == 0 and p.stale()
        await p.unpark()
        await p.park()  # parked again: fresh, and a note into it starts its job
        assert not p.stale()
        assert p.noted(handoff(store, 0, 3)) and executor.started == [3]

    run(main())
