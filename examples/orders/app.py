"""The order service's HTTP API: ``uvicorn examples.orders.app:app``.

``POST /orders`` writes the order and enqueues its charge (and its receipt, to run
after the charge) in one transaction on the app's own connection, given to deadman
as ``conn=``: all three commit together or not at all. ``GET /orders/{id}`` shows the
order, its payment and its charge; ``?wait=true`` first waits for the charge to end.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime
from http import HTTPStatus
from typing import Annotated

import psycopg
from fastapi import FastAPI, Header, HTTPException, Response
from psycopg.rows import DictRow
from psycopg_pool import AsyncConnectionPool
from pydantic import BaseModel, ConfigDict, Field

import deadman
from deadman.errors import NotFound
from examples.orders import db
from examples.orders.tasks import ChargeResult, charge, send_receipt

#: How long ``GET /orders/{id}?wait=true`` waits for the charge to end.
WAIT_S = 10.0


class NewOrder(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    customer: str = Field(min_length=1, max_length=200)
    email: str = Field(pattern=r"^[^@\s]+@[^@\s]+$", max_length=320)
    amount_cents: int = Field(gt=0)  # the upper bound is the database's (schema.sql)


class Placed(BaseModel):
    order_id: int
    charge_job_id: int
    receipt_job_id: int


class Order(BaseModel):
    id: int
    customer: str
    email: str
    amount_cents: int
    status: str  # pending | paid
    created_at: datetime
    payment_id: int | None
    paid_at: datetime | None
    charge_job_id: int
    charge_state: deadman.JobState | None  # None: deadman's cleaner has deleted the job
    charge_result: ChargeResult | None
    receipt_job_id: int


class Shop:
    """The service: its pool and its deadman client, both opened by :meth:`running`
    (the app's lifespan) and closed when it ends."""

    def __init__(self, dsn: str | None) -> None:
        self._dsn = dsn
        self._aclient: deadman.AsyncClient | None = None
        self._pool: AsyncConnectionPool[db.Conn] | None = None

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        # The client resolves the dsn (None: DEADMAN_DATABASE_URL) and the pool uses its.
        async with deadman.AsyncClient(self._dsn) as aclient, db.pool(aclient.dsn) as pool:
            async with pool.connection() as conn:
                await db.migrate(conn)
            self._aclient, self._pool = aclient, pool
            try:
                yield
            finally:
                self._aclient = self._pool = None

    @property
    def aclient(self) -> deadman.AsyncClient:
        assert self._aclient is not None, "the app is not running"
        return self._aclient

    @property
    def pool(self) -> AsyncConnectionPool[db.Conn]:
        assert self._pool is not None, "the app is not running"
        return self._pool

    async def place(self, order: NewOrder, key: str | None) -> Placed | None:
        """Store the order and enqueue its jobs, in one transaction; None when ``key``
        is taken already (then nothing of this call is kept)."""
        try:
            async with self.pool.connection() as conn, conn.transaction():
                # The id first: the row carries its jobs' ids, so they are enqueued before it.
                order_id = (await db.fetch_row(conn, "order_next_id", {}))["id"]
                charged = await charge.options(conn=conn).enqueue_async(
                    self.aclient, order_id=order_id, amount_cents=order.amount_cents
                )
                receipt = await send_receipt.options(conn=conn, depends_on=[charged]).enqueue_async(
                    self.aclient, order_id=order_id, email=order.email
                )
                row = {
                    "id": order_id,
                    **order.model_dump(),
                    "charge_job_id": charged.id,
                    "receipt_job_id": receipt.id,
                    "idempotency_key": key,
                }
                if await db.fetch_one(conn, "order_insert", row) is None:
                    raise psycopg.Rollback()  # the key is taken: both jobs go with the rollback
                return Placed(
                    order_id=order_id, charge_job_id=charged.id, receipt_job_id=receipt.id
                )
        except psycopg.errors.CheckViolation as exc:
            # Refused by the insert, after both enqueues: the rollback took the jobs too.
            if exc.diag.constraint_name != "orders_amount_online":
                raise
            raise HTTPException(
                HTTPStatus.UNPROCESSABLE_ENTITY,
                "amount_cents: more than is taken online (constraint orders_amount_online)",
            ) from None
        return None

    async def placed_before(self, order: NewOrder, key: str) -> Placed:
        """The order that holds ``key``: a repeat of ``order`` (409 if it is another)."""
        async with self.pool.connection() as conn:
            row = await db.fetch_row(conn, "order_by_key", {"idempotency_key": key})
        if {f: row[f] for f in NewOrder.model_fields} != order.model_dump():
            raise HTTPException(
                HTTPStatus.CONFLICT, "this Idempotency-Key was used for another order"
            )
        return Placed(
            order_id=row["id"],
            charge_job_id=row["charge_job_id"],
            receipt_job_id=row["receipt_job_id"],
        )

    async def order(self, order_id: int, *, wait: bool) -> Order:
        row = await self._order_row(order_id)
        if wait and row["status"] == "pending":
            # No pool connection is held while waiting: the client has its own.
            with contextlib.suppress(deadman.WaitTimeout, NotFound):
                await self.aclient.wait(row["charge_job_id"], timeout=WAIT_S)
            row = await self._order_row(order_id)
        job = await self.aclient.get(row["charge_job_id"])
        result = None
        if job is not None and job.state is deadman.JobState.SUCCEEDED:
            result = ChargeResult.model_validate(job.result)
        return Order(**row, charge_state=None if job is None else job.state, charge_result=result)

    async def _order_row(self, order_id: int) -> DictRow:
        async with self.pool.connection() as conn:
            row = await db.fetch_one(conn, "order_get", {"id": order_id})
        if row is None:
            raise HTTPException(HTTPStatus.NOT_FOUND, f"no order {order_id}")
        return row


def create_app(dsn: str | None = None) -> FastAPI:
    """The app over ``dsn`` (None: ``DEADMAN_DATABASE_URL``, read at start-up)."""
    shop = Shop(dsn)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with shop.running():
            yield

    app = FastAPI(title="orders: a deadman example", lifespan=lifespan)

    @app.post("/orders", status_code=HTTPStatus.CREATED)
    async def place_order(
        order: NewOrder,
        response: Response,
        idempotency_key: Annotated[str | None, Header(min_length=1, max_length=200)] = None,
    ) -> Placed:
        """201 with the new order's ids; 200 with the same ids for a repeat of a key."""
        placed = await shop.place(order, idempotency_key)
        if placed is None:
            assert idempotency_key is not None  # only a key can be taken
            response.status_code = HTTPStatus.OK
            placed = await shop.placed_before(order, idempotency_key)
        return placed

    @app.get("/orders/{order_id}")
    async def get_order(order_id: int, wait: bool = False) -> Order:
        return await shop.order(order_id, wait=wait)

    return app


app = create_app()
