"""Typed tasks for the acceptance tests: ``--app tests.acceptance.tasks_app:registry``.

The enqueuing test imports this module too, so a task's default type (its
module-qualified name, ``tests.acceptance.tasks_app.greet``) is the same on both
sides, as it is for an application and its workers.

- ``greet`` (sync, in a thread): a dataclass argument, a pydantic result.
- ``total`` (async, on the loop): a pydantic argument with a Decimal and a datetime.
- ``whoami`` (sync): the attempt's JobContext as its first parameter.
- ``pay`` (async): writes its effect in ``ctx.transaction()``, the result set there.
- ``receipt`` (async): ``ctx.result`` set to a pydantic model in ``ctx.transaction()``,
  stored through its return annotation.
- ``liar``: returns what its annotation does not allow (the attempt fails).
- ``nap`` (async): sleeps ``ms`` milliseconds, for a wait that really waits.
"""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import datetime
from decimal import Decimal

from pydantic import BaseModel

from deadman.registry import Registry
from deadman.worker.context import JobContext

registry = Registry()


@dataclasses.dataclass(frozen=True)
class Person:
    name: str
    languages: list[str]
    title: str | None = None


class Greeting(BaseModel):
    text: str
    length: int


class Line(BaseModel):
    sku: str
    qty: int
    price: Decimal


class Order(BaseModel):
    id: int
    placed_at: datetime
    lines: list[Line]


@registry.task(queue="tasks")
def greet(person: Person, punctuation: str = "!") -> Greeting:
    who = f"{person.title} {person.name}" if person.title else person.name
    text = f"Hello {who} ({', '.join(person.languages)}){punctuation}"
    return Greeting(text=text, length=len(text))


@registry.task(queue="tasks", max_attempts=2)
async def total(order: Order) -> dict[str, str]:
    amount = sum((line.price * line.qty for line in order.lines), Decimal(0))
    return {"order": str(order.id), "total": str(amount), "day": order.placed_at.date().isoformat()}


@registry.task(queue="tasks", type="tasks.whoami")
def whoami(ctx: JobContext, tag: str) -> dict[str, object]:
    return {"job_id": ctx.job_id, "attempt": ctx.attempt, "tag": tag}


async def _pay(ctx: JobContext, result: object) -> None:
    """The effect and the completion in one fenced transaction, ``result`` stored."""
    async with ctx.transaction() as conn:
        await conn.execute(
            "INSERT INTO deadman.effects (job_id, lease_token) VALUES (%s, %s)",
            (ctx.job_id, ctx.lease_token),
        )
        ctx.result = result


@registry.task(queue="tasks", type="tasks.pay")
async def pay(ctx: JobContext, amount: int) -> None:
    await _pay(ctx, {"paid": amount})


@registry.task(queue="tasks", type="tasks.receipt")
async def receipt(ctx: JobContext, amount: int) -> Greeting:
    stored = Greeting(text=f"paid {amount}", length=amount)
    await _pay(ctx, stored)  # a model as ctx.result: encoded by the annotation
    return stored


@registry.task(queue="tasks", type="tasks.liar", max_attempts=1)
def liar(n: int) -> Greeting:
    return {"text": n}  # type: ignore[return-value]  # what the test wants to see refused


@registry.task(queue="tasks", type="tasks.nap")
async def nap(ms: int) -> int:
    await asyncio.sleep(ms / 1000)
    return ms
