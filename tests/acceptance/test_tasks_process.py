"""Typed tasks run by a real worker process (``--app tests.acceptance.tasks_app``),
enqueued through the real clients, and waited for with deadman.waiting (the poll set
to 30 s: every answer comes by notification).

Sync and async functions, a dataclass and a pydantic argument, a JobContext
parameter, a result set inside ctx.transaction(), enqueue_async, enqueue_many of
``task.job(...)``, options for one call, a rolled-back transactional enqueue; and what
the worker makes of a payload that does not decode and of a result its annotation
refuses (the attempt fails, last_error says why)."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from decimal import Decimal

import psycopg

from deadman import AsyncClient, Client, JobState
from deadman.model import Job
from deadman.waiting import Waiter
from tests.acceptance import tasks_app
from tests.acceptance.tasks_app import (
    Line,
    Order,
    Person,
    greet,
    liar,
    nap,
    pay,
    receipt,
    total,
    whoami,
)
from tests.helpers.processes import SpawnWorker, attempts_of, sql_value, wait_registered

APP = "tests.acceptance.tasks_app:registry"
SLOW_POLL_S = 30.0


def test_typed_tasks_run_in_a_worker_process(db_dsn: str, spawn_worker: SpawnWorker) -> None:
    worker = spawn_worker(db_dsn, app=APP, queues="tasks", DEADMAN_POLL_S=SLOW_POLL_S)
    wait_registered(db_dsn, worker.pid)
    order = Order(
        id=12,
        placed_at=datetime(2031, 5, 6, 7, 8, tzinfo=UTC),
        lines=[
            Line(sku="a", qty=2, price=Decimal("1.25")),
            Line(sku="b", qty=1, price=Decimal("10")),
        ],
    )

    async def enqueue_async() -> Job:
        async with AsyncClient(db_dsn) as aclient:
            return await total.enqueue_async(aclient, order)

    with Client(db_dsn) as client, Waiter(db_dsn, poll_s=SLOW_POLL_S) as waiter:
        with psycopg.connect(db_dsn) as conn:  # joins the caller's transaction...
            gone = greet.options(conn=conn).enqueue(client, Person("Nobody", []))
            conn.rollback()  # ...and goes with it
        sent = {
            "greet": greet.enqueue(
                client, Person("Ada", ["en", "fr"], title="Dr"), punctuation="?"
            ),
            "total": asyncio.run(enqueue_async()),
            "whoami": whoami.options(priority=5).enqueue(client, tag="t1"),
            "pay": pay.options(idempotency_key="pay-1").enqueue(client, amount=5),
            "receipt": receipt.enqueue(client, amount=7),
            "liar": liar.enqueue(client, 3),
            # a payload sent by hand that the task cannot decode
            "bad": client.enqueue(
                greet.type, {"person": {"name": 5}}, queue="tasks", max_attempts=1
            ),
        }
        many = client.enqueue_many(greet.job(client, Person(f"p{i}", ["de"])) for i in range(20))
        started = time.monotonic()
        done = {name: waiter.wait(job.id, timeout=60) for name, job in sent.items()}
        rest = [waiter.wait(job_id, timeout=60) for job_id in many]
        took = time.monotonic() - started

    assert sql_value(db_dsn, "SELECT count(*) FROM deadman.jobs WHERE id = %s", (gone.id,)) == 0
    assert took < SLOW_POLL_S, "answered by the fallback poll, not by notifications"
    assert greet.type == "tests.acceptance.tasks_app.greet"  # the default: module-qualified
    assert {n: d.state for n, d in done.items()} == {
        "greet": JobState.SUCCEEDED,
        "total": JobState.SUCCEEDED,
        "whoami": JobState.SUCCEEDED,
        "pay": JobState.SUCCEEDED,
        "receipt": JobState.SUCCEEDED,
        "liar": JobState.DEAD,
        "bad": JobState.DEAD,
    }
    assert done["greet"].result == {"text": "Hello Dr Ada (en, fr)?", "length": 22}
    assert done["total"].result == {"order": "12", "total": "12.50", "day": "2031-05-06"}
    assert done["whoami"].result == {"job_id": sent["whoami"].id, "attempt": 1, "tag": "t1"}
    assert done["pay"].result == {"paid": 5}
    assert done["receipt"].result == {"text": "paid 7", "length": 7}  # a model, encoded
    effects = sql_value(
        db_dsn, "SELECT count(*) FROM deadman.effects WHERE job_id = %s", (sent["pay"].id,)
    )
    assert effects == 1
    assert "tasks.liar returned what its annotation does not allow" in (
        done["liar"].last_error or ""
    )
    bad = done["bad"].last_error or ""
    assert "InvalidArguments" in bad and "person.name: input should be a valid string" in bad
    assert "person.languages: is required" in bad
    assert [r.result["text"] for r in rest] == [f"Hello p{i} (de)!" for i in range(20)]
    assert [a["outcome"] for a in attempts_of(db_dsn, sent["bad"].id)] == ["failed"]
    assert sent["whoami"].priority == 5 and sent["total"].max_attempts == 2
    assert tasks_app.registry.types() == sorted(
        [
            greet.type,
            total.type,
            "tasks.whoami",
            "tasks.pay",
            "tasks.receipt",
            "tasks.liar",
            "tasks.nap",
        ]
    )


def test_a_wait_returns_as_the_worker_finishes_the_job(
    db_dsn: str, spawn_worker: SpawnWorker
) -> None:
    """The wait starts before the job does and ends within notification latency of
    the finish (the database's finished_at against the local clock: one machine)."""
    worker = spawn_worker(db_dsn, app=APP, queues="tasks", DEADMAN_POLL_S=SLOW_POLL_S)
    wait_registered(db_dsn, worker.pid)
    with Client(db_dsn) as client, Waiter(db_dsn, poll_s=SLOW_POLL_S) as waiter:
        for ms in (300, 800):
            job = nap.enqueue(client, ms)
            started = time.monotonic()
            done = waiter.wait(job.id, timeout=30)
            returned_at = time.time()
            assert time.monotonic() - started >= ms / 1000 * 0.9  # it did wait
            assert done.state is JobState.SUCCEEDED and done.result == ms
            assert done.finished_at is not None
            assert returned_at - done.finished_at.timestamp() < 2.0
