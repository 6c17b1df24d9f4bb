"""Typed tasks (deadman.tasks) without a database: the payload a call becomes and the
arguments a payload becomes again (a hypothesis round trip through JSON text, as
Postgres stores it), the refusals at enqueue (before the client is asked anything),
at decoration, and when a worker decodes a hostile payload or the function returns
what its annotation does not allow; the options; the registry."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from enum import Enum
from types import SimpleNamespace
from typing import Any, Literal, Unpack

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from deadman.client import Client
from deadman.clientcore.options import JobOptions
from deadman.errors import ConfigError
from deadman.model import Job
from deadman.registry import Registry
from deadman.spec import SpecError
from deadman.store import NewJob
from deadman.tasks import InvalidArguments, InvalidResult, Task
from deadman.worker.context import JobContext


class Color(Enum):
    RED = "red"
    BLUE = "blue"


@dataclasses.dataclass(frozen=True)
class Address:
    street: str
    number: int
    note: str | None = None


class Order(BaseModel):
    id: int
    amount: Decimal
    placed_at: datetime
    tags: list[str] = []
    color: Color = Color.RED


class Receipt(BaseModel):
    order: int
    total: Decimal


registry = Registry()


@registry.task(queue="mail", max_attempts=3, timeout=30, type="test.ship")
def ship(
    order: Order, to: Address, express: bool = False, notes: dict[str, int] | None = None
) -> Receipt:
    return Receipt(order=order.id, total=order.amount * (2 if express else 1))


@registry.task(type="test.ctx")
async def with_ctx(ctx: JobContext, n: int, /, label: str = "x") -> dict[str, Any]:
    return {"n": n, "label": label, "ctx": type(ctx).__name__}


@registry.task(type="test.clash")
def clash(queue: str, conn: int, delay: float, options: str, json: str) -> None:
    """Parameters named like job options and BaseModel attributes: no collision."""


@registry.task(type="test.later")
def later(item: Later) -> Later:
    return item


@dataclasses.dataclass
class Later:  # defined after the task that names it
    x: int


class FakeClient:
    """Records what a task asks of a client."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, Any, dict[str, Any]]] = []

    def job(self, type: str, payload: Any = None, **options: Unpack[JobOptions]) -> NewJob:
        self.calls.append(("job", type, payload, dict(options)))
        return NewJob(type, payload)

    def enqueue(
        self, type: str, payload: Any = None, *, conn: Any = None, **options: Unpack[JobOptions]
    ) -> Job:
        self.calls.append(("enqueue", type, payload, {"conn": conn, **options}))
        return None  # type: ignore[return-value]  # the tests read the calls, not the job


class FakeAsyncClient(FakeClient):
    async def enqueue(  # type: ignore[override]
        self, type: str, payload: Any = None, *, conn: Any = None, **options: Unpack[JobOptions]
    ) -> Job:
        return FakeClient.enqueue(self, type, payload, conn=conn, **options)


ORDER = Order(id=7, amount=Decimal("19.99"), placed_at=datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC))
HOME = Address("Main St", 5)


def carrying(payload: Any) -> Job:
    """A job as a handler reads it (only its payload matters to a task)."""
    job = Job.__new__(Job)
    object.__setattr__(job, "payload", payload)
    return job


def run(task: Task[Any, Any], payload: Any, ctx: Any = None) -> Any:
    """What the worker does with a job of the task's type: the registered handler."""
    spec = registry.get(task.type)
    assert spec is not None and spec.fn == task.handler
    result = spec.fn(carrying(payload), ctx)
    return asyncio.run(result) if spec.is_async else result


# --------------------------------------------------------------------------- payloads


def test_a_call_becomes_one_json_value_per_parameter_defaults_included() -> None:
    payload = ship.encode(ORDER, to=HOME)
    assert payload == {
        "order": {
            "id": 7,
            "amount": "19.99",
            "placed_at": "2030-01-02T03:04:05Z",
            "tags": [],
            "color": "red",
        },
        "to": {"street": "Main St", "number": 5, "note": None},
        "express": False,
        "notes": None,
    }
    # one call, one payload: positional or keyword, default given or not
    assert ship.encode(order=ORDER, to=HOME, express=False) == payload
    args, kwargs = ship.decode(json.loads(json.dumps(payload)))
    assert args == [] and kwargs == {"order": ORDER, "to": HOME, "express": False, "notes": None}


def test_the_worker_decodes_calls_and_encodes_the_result() -> None:
    payload = ship.encode(ORDER, HOME, express=True)
    assert run(ship, json.loads(json.dumps(payload))) == {"order": 7, "total": "39.98"}


def test_a_context_parameter_is_passed_and_not_sent() -> None:
    assert with_ctx.encode(3) == {"n": 3, "label": "x"}
    ctx = SimpleNamespace()  # what the worker passes: the attempt's JobContext
    expected = {"n": 3, "label": "y", "ctx": "SimpleNamespace"}
    assert run(with_ctx, {"n": 3, "label": "y"}, ctx) == expected
    assert registry.get("test.ctx") is not None and registry.get("test.ctx").is_async  # type: ignore[union-attr]


def test_a_task_is_still_the_plain_function() -> None:
    assert ship(ORDER, HOME, express=True) == Receipt(order=7, total=Decimal("39.98"))
    assert asyncio.run(with_ctx(None, 2)) == {"n": 2, "label": "x", "ctx": "NoneType"}
    assert ship.__name__ == "ship" and ship.__doc__ is None and clash.__doc__
    assert repr(ship) == "<Task test.ship>"


def test_parameters_named_like_options_do_not_collide() -> None:
    fake = FakeClient()
    clash.options(queue="other", conn="the-conn").enqueue(
        fake, queue="q", conn=1, delay=0.5, options="o", json="j"
    )
    [(_, _, payload, options)] = fake.calls
    assert payload == {"queue": "q", "conn": 1, "delay": 0.5, "options": "o", "json": "j"}
    assert options == {"conn": "the-conn", "queue": "other"}


def test_a_forward_reference_is_resolved_at_first_use() -> None:
    assert later.encode(Later(1)) == {"item": {"x": 1}}
    assert run(later, {"item": {"x": 2}}) == {"x": 2}


@dataclasses.dataclass(frozen=True)
class Line:
    sku: str
    qty: int
    price: float


class Cart(BaseModel):
    owner: str
    lines: list[Line]
    coupon: str | None = None
    meta: dict[str, list[int]] = {}
    kind: Literal["web", "shop"] = "web"
    at: datetime | None = None


@registry.task(type="test.cart")
def checkout(cart: Cart, extra: list[Line] | None = None, pair: tuple[int, str] = (0, "")) -> None:
    return None


TEXT = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=12)
LINES = st.builds(
    Line, TEXT, st.integers(-(2**53), 2**53), st.floats(allow_nan=False, allow_infinity=False)
)
CARTS = st.builds(
    Cart,
    owner=TEXT,
    lines=st.lists(LINES, max_size=3),
    coupon=st.none() | TEXT,
    meta=st.dictionaries(TEXT, st.lists(st.integers(-1000, 1000), max_size=3), max_size=3),
    kind=st.sampled_from(["web", "shop"]),
    at=st.none() | st.datetimes(timezones=st.just(UTC)),
)


@given(
    cart=CARTS,
    extra=st.none() | st.lists(LINES, max_size=2),
    pair=st.tuples(st.integers(-5, 5), TEXT),
)
@settings(max_examples=200, deadline=None, database=None)
def test_encode_then_decode_through_json_text_gives_the_call_back(
    cart: Cart, extra: list[Line] | None, pair: tuple[int, str]
) -> None:
    payload = checkout.encode(cart, extra=extra, pair=pair)
    stored = json.loads(json.dumps(payload, ensure_ascii=False))  # as jsonb gives it back
    args, kwargs = checkout.decode(stored)
    assert args == []
    assert kwargs == {"cart": cart, "extra": extra, "pair": pair}
    assert checkout.encode(**kwargs) == payload  # and the same payload again


# --------------------------------------------------------------------------- refusals


@pytest.mark.parametrize(
    ("args", "kwargs", "fields"),
    [
        ((), {"to": HOME}, {"order"}),
        ((ORDER, HOME), {"express": "yes"}, {"express"}),
        ((ORDER, HOME), {"carrier": "ups"}, {"carrier"}),
        ((ORDER,), {"to": {"street": "x", "number": 1}}, {"to"}),  # a dict is not an Address
        ((ORDER, Address("x", "1")), {}, {"to.number"}),  # type: ignore[arg-type]
        ((ORDER, HOME), {"notes": {"a": "1"}}, {"notes.a"}),
        ((ORDER, HOME, False, None, 1), {}, {"args"}),
        ((ORDER, HOME), {"order": ORDER}, {"order"}),
        ((ORDER, Address("a\x00b", 1)), {}, {"to.street"}),
    ],
)
def test_arguments_that_do_not_fit_are_refused_before_anything_is_sent(
    args: tuple[Any, ...], kwargs: dict[str, Any], fields: set[str]
) -> None:
    fake = FakeClient()
    with pytest.raises(InvalidArguments) as caught:
        ship.enqueue(fake, *args, **kwargs)
    assert {e["field"] for e in caught.value.errors} == fields
    assert str(caught.value).startswith("test.ship: ")
    assert isinstance(caught.value, SpecError)
    assert fake.calls == []


def test_the_messages_say_what_is_wrong() -> None:
    with pytest.raises(InvalidArguments) as caught:
        ship.encode(to=HOME, carrier="ups", express=1.5)
    assert sorted((e["field"], e["message"]) for e in caught.value.errors) == [
        ("carrier", "is not a parameter of test.ship"),
        ("express", "input should be a valid boolean"),
        ("order", "is required"),
    ]


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_numbers_json_cannot_hold_are_refused(value: float) -> None:
    with pytest.raises(InvalidArguments):
        checkout.encode(Cart(owner="o", lines=[Line("s", 1, value)]))


HOSTILE_PAYLOADS: list[tuple[Any, set[str]]] = [
    ([1, 2], {"payload"}),
    ("text", {"payload"}),
    (5, {"payload"}),
    ({}, {"order", "to"}),
    ({"order": None, "to": None}, {"order", "to"}),
    ({**ship.encode(ORDER, HOME), "evil": 1}, {"evil"}),
    ({**ship.encode(ORDER, HOME), "express": "true"}, {"express"}),
    (
        {**ship.encode(ORDER, HOME), "order": {"id": "7"}},
        {"order.id", "order.amount", "order.placed_at"},
    ),
    ({**ship.encode(ORDER, HOME), "to": {"street": "x", "number": 1.5}}, {"to.number"}),
]


@pytest.mark.parametrize(("payload", "fields"), HOSTILE_PAYLOADS)
def test_a_payload_that_does_not_decode_fails_the_attempt_naming_each_parameter(
    payload: Any, fields: set[str]
) -> None:
    with pytest.raises(InvalidArguments) as caught:
        run(ship, payload)
    assert {e["field"] for e in caught.value.errors} == fields


def test_no_payload_is_a_call_without_arguments() -> None:
    r = Registry()

    @r.task(type="t.ping")
    def ping() -> str:
        return "pong"

    assert ping.encode() == {}
    assert ping.handler(carrying(None), None) == "pong"  # type: ignore[arg-type]
    assert ping.handler(carrying({}), None) == "pong"  # type: ignore[arg-type]


def test_a_result_its_annotation_does_not_allow_fails_the_attempt() -> None:
    r = Registry()

    @r.task(type="t.liar")
    def liar(n: int) -> Receipt:
        return {"order": n}  # type: ignore[return-value]

    @r.task(type="t.free")
    def free(n: int):  # type: ignore[no-untyped-def]  # no annotation: returned as it is
        return {"n": n, "when": "now"}

    job = carrying({"n": 1})
    with pytest.raises(InvalidResult, match=r"t\.liar returned what its annotation does not allow"):
        liar.handler(job, None)  # type: ignore[arg-type]
    assert free.handler(job, None) == {"n": 1, "when": "now"}  # type: ignore[arg-type]


def test_signatures_that_cannot_be_sent_are_refused_at_decoration() -> None:
    r = Registry()

    def star(*items: int) -> None: ...
    def stars(**items: int) -> None: ...
    def bare(x) -> None: ...  # type: ignore[no-untyped-def]
    def late_ctx(n: int, ctx: JobContext) -> None: ...
    def opaque(conn: Registry) -> None: ...

    cases: list[tuple[Callable[..., Any], str]] = [
        (star, "*items cannot be sent"),
        (stars, "**items cannot be sent"),
        (bare, "'x' needs a type annotation"),
        (late_ctx, "the JobContext parameter 'ctx' must come first"),
        (opaque, "cannot be JSON"),
    ]
    for fn, words in cases:
        with pytest.raises(ConfigError, match=re.escape(words)):
            r.task(type=f"t.{fn.__name__}")(fn)
    assert r.types() == []


def test_the_default_type_is_the_module_qualified_name() -> None:
    assert clash.type == "test.clash"
    r = Registry()

    def ok(n: int) -> None: ...

    with pytest.raises(ConfigError, match="give it type="):  # <locals> is not a job type
        r.task(ok)
    ok.__qualname__ = "ok"
    assert r.task(ok).type == "tests.unit.test_tasks.ok"
    ok.__module__ = "__main__"
    with pytest.raises(ConfigError, match="defined in __main__"):
        r.task(ok)
    with pytest.raises(ConfigError, match="job type 'a b'"):
        r.task(type="a b")(ok)


def test_decorator_options_are_checked_at_decoration() -> None:
    r = Registry()

    def f(n: int) -> None: ...

    with pytest.raises(SpecError, match="queue"):
        r.task(type="t.f", queue="no spaces")(f)
    with pytest.raises(SpecError, match="max_attempts"):
        r.task(type="t.f", max_attempts=0)(f)
    r.task(type="t.f", queue="q", timeout=timedelta(seconds=5))(f)
    with pytest.raises(ConfigError, match="already registered"):
        r.task(type="t.f")(f)


# --------------------------------------------------------------------------- sending


def test_enqueue_passes_the_decorator_options_and_each_call_s_own() -> None:
    fake = FakeClient()
    ship.enqueue(fake, ORDER, HOME)
    ship.options(delay=30, idempotency_key="k1", queue="rush", conn="c").enqueue(fake, ORDER, HOME)
    (_, t1, p1, o1), (_, t2, p2, o2) = fake.calls
    assert t1 == t2 == "test.ship" and p1 == p2 == ship.encode(ORDER, HOME)
    assert o1 == {"conn": None, "queue": "mail", "max_attempts": 3, "timeout": 30}
    assert o2 == {
        "conn": "c",
        "queue": "rush",
        "max_attempts": 3,
        "timeout": 30,
        "delay": 30,
        "idempotency_key": "k1",
    }


def test_enqueue_async_sends_through_an_async_client() -> None:
    fake = FakeAsyncClient()
    asyncio.run(ship.options(priority=5).enqueue_async(fake, ORDER, to=HOME))
    [(_, type_, payload, options)] = fake.calls
    assert (type_, payload) == ("test.ship", ship.encode(ORDER, HOME))
    assert options["priority"] == 5 and options["queue"] == "mail"
    with pytest.raises(InvalidArguments):
        asyncio.run(ship.enqueue_async(fake, to=HOME))  # type: ignore[call-arg]
    assert len(fake.calls) == 1


def test_job_builds_a_checked_new_job_with_the_real_client() -> None:
    client = Client("postgresql://nowhere.invalid/x")  # nothing connects for job()
    new = ship.options(priority=9).job(client, ORDER, HOME)
    assert (new.type, new.queue, new.priority, new.max_attempts) == ("test.ship", "mail", 9, 3)
    assert new.timeout_ms == 30_000 and new.payload == ship.encode(ORDER, HOME)
    with pytest.raises(TypeError, match="conn= is for enqueue"):
        ship.options(conn=object()).job(client, ORDER, HOME)


def test_plain_handlers_and_tasks_share_a_registry() -> None:
    r = Registry()

    @r.handler("plain")
    def plain(job: Job, ctx: JobContext) -> str:
        return "plain"

    @r.task(type="typed")
    def typed(n: int) -> int:
        return n + 1

    merged = r.merged(Registry())
    assert merged.types() == ["plain", "typed"]
    spec = merged.get("typed")
    assert spec is not None and not spec.is_async
    assert spec.fn(carrying({"n": 1}), None) == 2  # type: ignore[arg-type]
    assert merged.get("plain").fn is plain  # type: ignore[union-attr]
