"""The order service's jobs: ``deadman worker --app examples.orders.tasks:registry``.

``charge`` writes the payment and marks the order paid inside ``ctx.transaction()``:
the job's completion commits in that same transaction, fenced by the attempt's lease,
so however often the charge runs (a worker killed mid-charge, a lease lost to a
stall), exactly one payment is ever committed. ``send_receipt`` is enqueued by the app
with ``depends_on`` the charge: it runs once the charge succeeded, and is cancelled if
the charge ends dead.
"""

from __future__ import annotations

from pydantic import BaseModel

from deadman import JobContext, Registry
from examples.orders.db import fetch_one, fetch_row

registry = Registry()


class ChargeResult(BaseModel):
    payment_id: int
    amount_cents: int
    provider_key: str


class Receipt(BaseModel):
    to: str
    subject: str
    text: str


class OrderNotPending(Exception):
    """The order is unknown or paid already: this charge must not happen."""


@registry.task(max_attempts=5, timeout=30)
async def charge(ctx: JobContext, order_id: int, amount_cents: int) -> ChargeResult:
    # A real payment provider gets ctx.idempotency_key (stable across attempts), so a
    # call made by an attempt that then lost its lease is dropped when repeated.
    provider_key = ctx.idempotency_key
    async with ctx.transaction() as conn:
        payment = await fetch_row(
            conn,
            "payment_insert",
            {
                "order_id": order_id,
                "amount_cents": amount_cents,
                "provider_key": provider_key,
                "job_id": ctx.job_id,
            },
        )
        if await fetch_one(conn, "order_mark_paid", {"id": order_id}) is None:
            raise OrderNotPending(f"order {order_id} is not pending")  # rolls the payment back
        result = ChargeResult(
            payment_id=payment["id"], amount_cents=amount_cents, provider_key=provider_key
        )
        # Inside ctx.transaction() the result is stored from ctx.result (JSON), at the
        # commit, not from what the function returns.
        ctx.result = result.model_dump(mode="json")
    return result


@registry.task(max_attempts=3)
def send_receipt(order_id: int, email: str) -> Receipt:
    # Stands in for the mail relay: the message is the job's result. A real send would
    # take ctx (a first JobContext parameter) and give the relay ctx.idempotency_key,
    # so that a retried send is dropped.
    return Receipt(
        to=email,
        subject=f"Your order {order_id} is paid",
        text=f"Thank you. Order {order_id} has been charged.",
    )
