"""The example order service (examples/orders) end to end: its FastAPI app served in
this process (uvicorn in a thread, real HTTP) and its tasks run by a real ``deadman
worker`` process, against a fresh database of the throwaway cluster.

An order and its jobs commit together: charged once by the worker, its result
stored, its receipt sent after it; an order the database refuses after the enqueue
leaves no job; a repeated Idempotency-Key (one after the other, or racing) gives the
same order and jobs; a body FastAPI refuses stores nothing; and a worker SIGKILLed
in the middle of a charge (its payment written, not committed) leaves exactly one
payment, written by the worker that took the job over.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

import httpx
import psycopg

from examples.orders.app import create_app
from tests.helpers import wait_for
from tests.helpers.api import client, serve
from tests.helpers.processes import (
    LATE_S,
    SpawnWorker,
    attempts_of,
    sql_all,
    sql_one,
    wait_registered,
    wait_state,
)

APP = "examples.orders.tasks:registry"
ORDER = {"customer": "Ada", "email": "ada@example.com", "amount_cents": 1999}


@contextmanager
def orders_api(dsn: str) -> Iterator[httpx.Client]:
    with serve(create_app(dsn)) as base_url, client(base_url) as api:
        yield api


def stored(dsn: str) -> dict[str, Any]:
    row = sql_one(
        dsn,
        "SELECT (SELECT count(*) FROM shop.orders) AS orders,"
        " (SELECT count(*) FROM shop.payments) AS payments,"
        " (SELECT count(*) FROM deadman.jobs) AS jobs",
    )
    assert row is not None
    return row


def payments(dsn: str) -> list[dict[str, Any]]:
    return sql_all(dsn, "SELECT * FROM shop.payments ORDER BY id")


def test_an_order_is_charged_once_and_its_receipt_sent(
    db_dsn: str, spawn_worker: SpawnWorker
) -> None:
    worker = spawn_worker(db_dsn, app=APP)
    wait_registered(db_dsn, worker.pid)
    with orders_api(db_dsn) as api:
        placed = api.post("/orders", json=ORDER)
        assert placed.status_code == 201, placed.text
        ids = placed.json()
        order = api.get(f"/orders/{ids['order_id']}", params={"wait": "true"}).json()

    (payment,) = payments(db_dsn)
    charge_key = f"deadman-job-{ids['charge_job_id']}"
    assert (payment["order_id"], payment["amount_cents"], payment["job_id"]) == (
        ids["order_id"],
        1999,
        ids["charge_job_id"],
    )
    assert payment["provider_key"] == charge_key
    assert order == {
        "id": ids["order_id"],
        **ORDER,
        "status": "paid",
        "created_at": order["created_at"],
        "payment_id": payment["id"],
        "paid_at": order["paid_at"],
        "charge_job_id": ids["charge_job_id"],
        "charge_state": "succeeded",
        "charge_result": {
            "payment_id": payment["id"],
            "amount_cents": 1999,
            "provider_key": charge_key,
        },
        "receipt_job_id": ids["receipt_job_id"],
    }
    assert datetime.fromisoformat(order["paid_at"]) == payment["created_at"]
    receipt = wait_state(db_dsn, ids["receipt_job_id"], "succeeded", timeout=LATE_S)
    assert receipt["result"] == {
        "to": "ada@example.com",
        "subject": f"Your order {ids['order_id']} is paid",
        "text": f"Thank you. Order {ids['order_id']} has been charged.",
    }
    assert [a["outcome"] for a in attempts_of(db_dsn, ids["charge_job_id"])] == ["succeeded"]


BAD_BODIES: list[Any] = [
    {k: v for k, v in ORDER.items() if k != "customer"},
    {**ORDER, "amount_cents": 0},
    {**ORDER, "amount_cents": -5},
    {**ORDER, "amount_cents": "1999"},  # strict: a string is not an amount
    {**ORDER, "amount_cents": 19.99},
    {**ORDER, "email": "not an address"},
    {**ORDER, "customer": ""},
    {**ORDER, "coupon": "FREE"},  # unknown fields are refused, not dropped
    [ORDER],
    None,
]


def test_refused_orders_store_nothing(db_dsn: str) -> None:
    with orders_api(db_dsn) as api:
        for body in BAD_BODIES:
            response = api.post("/orders", json=body)
            assert response.status_code == 422, (body, response.text)
        bad_key = api.post("/orders", json=ORDER, headers={"Idempotency-Key": ""})
        assert bad_key.status_code == 422, bad_key.text
        # Valid for the API, refused by the database's CHECK, after both enqueues...
        too_much = api.post("/orders", json={**ORDER, "amount_cents": 1_000_001})
        assert too_much.status_code == 422, too_much.text
        assert "amount_cents" in too_much.json()["detail"]

    # ... which did run: the jobs' identity was drawn from, and rolled back with the order.
    jobs_seq = sql_one(
        db_dsn,
        "SELECT last_value FROM pg_sequences"  # NULL until a value is drawn
        " WHERE schemaname = 'deadman' AND sequencename = 'jobs_id_seq'",
    )
    assert jobs_seq == {"last_value": 2}
    assert stored(db_dsn) == {"orders": 0, "payments": 0, "jobs": 0}


def test_a_repeated_key_gives_the_same_order_and_jobs(db_dsn: str) -> None:
    with orders_api(db_dsn) as api:
        first = api.post("/orders", json=ORDER, headers={"Idempotency-Key": "k-1"})
        again = api.post("/orders", json=ORDER, headers={"Idempotency-Key": "k-1"})
        other = api.post(
            "/orders", json={**ORDER, "amount_cents": 5}, headers={"Idempotency-Key": "k-1"}
        )
        assert (first.status_code, again.status_code, other.status_code) == (201, 200, 409)
        assert again.json() == first.json()

        # Racing twins: each enqueues its jobs, all but one find the key taken at the
        # insert (ON CONFLICT waits for the first to commit) and roll back.
        n = 6
        barrier = threading.Barrier(n)
        answers: list[httpx.Response] = []

        def post() -> None:
            with client(str(api.base_url)) as own:
                barrier.wait(timeout=30)
                answers.append(own.post("/orders", json=ORDER, headers={"Idempotency-Key": "k-2"}))

        threads = [threading.Thread(target=post) for _ in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)

    assert sorted(a.status_code for a in answers) == [200] * (n - 1) + [201]
    assert len({a.text for a in answers}) == 1, [a.text for a in answers]
    assert stored(db_dsn) == {"orders": 2, "payments": 0, "jobs": 4}


def test_a_worker_killed_mid_charge_leaves_one_payment(
    db_dsn: str, spawn_worker: SpawnWorker
) -> None:
    with orders_api(db_dsn) as api:
        ids = api.post("/orders", json=ORDER).json()
    order_id, charge_id = ids["order_id"], ids["charge_job_id"]

    # Hold the order row so that the charge stops after writing its payment, at the
    # UPDATE that marks the order paid (the payment's foreign key only needs KEY SHARE).
    with psycopg.connect(db_dsn) as holder:
        holder.execute("SELECT 1 FROM shop.orders WHERE id = %s FOR NO KEY UPDATE", (order_id,))
        victim = spawn_worker(db_dsn, app=APP, name="victim")
        wait_for(
            lambda: sql_one(
                db_dsn,
                "SELECT 1 FROM pg_stat_activity WHERE datname = current_database()"
                " AND wait_event_type = 'Lock' AND query LIKE '%UPDATE shop.orders SET status%'",
            ),
            timeout=30,
            message="the charge to wait on the order row",
        )
        victim.send(signal.SIGKILL)
        assert victim.wait_exit(5) == -signal.SIGKILL
        holder.rollback()  # the victim's transaction, payment and all, rolls back

    survivor = spawn_worker(db_dsn, app=APP, name="survivor")
    survivor_id = wait_registered(db_dsn, survivor.pid)
    wait_state(db_dsn, charge_id, "succeeded", timeout=30)
    wait_state(db_dsn, ids["receipt_job_id"], "succeeded", timeout=LATE_S)

    lost, won = attempts_of(db_dsn, charge_id)
    assert (lost["outcome"], won["outcome"], won["worker"]) == (
        "lease_expired",
        "succeeded",
        survivor_id,
    )
    (payment,) = payments(db_dsn)
    assert (payment["order_id"], payment["job_id"]) == (order_id, charge_id)
    assert sql_one(db_dsn, "SELECT status FROM shop.orders WHERE id = %s", (order_id,)) == {
        "status": "paid"
    }
