"""Statements written once, run sync or async: a plan yields each statement it needs
and is sent that statement's rows (sans-IO, as psycopg's own ``generators``);
``run_sync`` and ``run_async`` drive it on a connection.

This is how the Python clients, ``SyncStore`` and ``AsyncStore`` share one
implementation of each operation: what to run, with which parameters, and how to read
the rows live in the plan (``deadman.store.plans``); only the driving differs.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, Generic, LiteralString, TypeVar

import psycopg
from psycopg.pq import ExecStatus, Format
from psycopg.rows import DictRow, dict_row

from deadman.db import copyrows, jsoncodec
from deadman.db.queries import QUERIES
from deadman.errors import translate

R = TypeVar("R")
T = TypeVar("T")
Rows = list[DictRow]


@dataclass(frozen=True)
class Query:
    """Run the named query with ``params``; the plan is sent its rows ([] if none)."""

    name: LiteralString
    params: dict[str, Any]


@dataclass(frozen=True)
class Copy:
    """``COPY ... FROM STDIN`` (the named query) with ``rows``; the plan is sent [].

    ``tentative``: under a savepoint. If the server refuses it with a unique violation
    or a deadlock, the savepoint is rolled back (the transaction, and what the plan
    did before, go on) and :class:`Refused` is thrown into the plan at this step."""

    name: LiteralString
    rows: Iterable[Sequence[Any]]
    tentative: bool = False


class Refused(Exception):
    """A tentative step's refusal, thrown into its plan; ``cause`` is the server's error
    (a plan that does not expect it raises ``cause``)."""

    def __init__(self, cause: psycopg.Error) -> None:
        super().__init__(str(cause))
        self.cause = cause

    @property
    def constraint(self) -> str | None:
        """The unique constraint violated (None for a deadlock)."""
        return self.cause.diag.constraint_name


#: What a tentative step's refusal may be: the rows are fine, another transaction got
#: there first (or the two waited on each other).
_REFUSALS = (psycopg.errors.UniqueViolation, psycopg.errors.DeadlockDetected)


Step = Query | Copy
#: what a plan's generator is: it yields steps, is sent their rows, returns the result
Steps = Generator[Step, Rows, R]


@dataclass(frozen=True)
class Plan(Generic[R]):
    """One operation's statements. ``steps()`` starts a fresh run each time it is
    called (AsyncStore retries a plan whole). ``atomic``: its statements must commit
    together, so a runner on a connection in autocommit opens a transaction for them
    (a savepoint inside the caller's ``conn.transaction()`` block); on a connection
    already in the caller's transaction they join it, theirs to commit or roll back."""

    steps: Callable[[], Steps[R]]
    atomic: bool = False


def one(query: Query, read: Callable[[Rows], R]) -> Plan[R]:
    """A plan of one statement whose rows ``read`` turns into the result."""

    def steps() -> Steps[R]:
        return read((yield query))

    return Plan(steps)


def then(plan: Plan[T], after: Callable[[T], R]) -> Plan[R]:
    """``plan``, its result passed through ``after`` (as atomic as ``plan``)."""

    def steps() -> Steps[R]:
        return after((yield from plan.steps()))

    return Plan(steps, plan.atomic)


def run_sync(conn: psycopg.Connection[Any], plan: Plan[R]) -> R:
    """Run ``plan`` on ``conn`` (see :class:`Plan` for its transaction)."""
    with translate():
        if plan.atomic and conn.autocommit:
            with conn.transaction():
                return _drive_sync(conn, plan.steps())
        return _drive_sync(conn, plan.steps())


async def run_async(conn: psycopg.AsyncConnection[Any], plan: Plan[R]) -> R:
    """Run ``plan`` on ``conn``, as :func:`run_sync` does."""
    with translate():
        if plan.atomic and conn.autocommit:
            async with conn.transaction():
                return await _drive_async(conn, plan.steps())
        return await _drive_async(conn, plan.steps())


#: The loaders of the JSON types (oid, format, loader) that Deadman's own connections
#: use (deadman.db.jsoncodec: orjson where it is exact). A caller's connection may load
#: them otherwise (Django's loads jsonb as text, to decode it itself); a plan reads
#: payloads, results and backoffs as values, so its cursor uses these. (They were
#: psycopg's global ones, which differ from jsoncodec's: every plan on Deadman's own
#: connections re-registered four loaders and decoded with ``json``.)
_JSON_LOADERS = [
    (
        jsoncodec.CONTEXT.types[name].oid,
        fmt,
        jsoncodec.CONTEXT.get_loader(jsoncodec.CONTEXT.types[name].oid, fmt),
    )
    for name in ("json", "jsonb")
    for fmt in (Format.TEXT, Format.BINARY)
]


def _json_loaders(cur: psycopg.Cursor[Any] | psycopg.AsyncCursor[Any]) -> None:
    for oid, fmt, loader in _JSON_LOADERS:
        if loader is not None and cur.adapters.get_loader(oid, fmt) is not loader:
            cur.adapters.register_loader(oid, loader)


def _drive_sync(conn: psycopg.Connection[Any], steps: Steps[R]) -> R:
    # dict rows whatever the caller's connection's row factory
    with conn.cursor(row_factory=dict_row) as cur:
        _json_loaders(cur)
        step = _advance(steps, None)
        while isinstance(step, Query | Copy):
            if isinstance(step, Copy):
                try:
                    with (
                        conn.transaction() if step.tentative else nullcontext(),
                        cur.copy(QUERIES[step.name]) as copy,
                    ):
                        copyrows.write_rows(copy, step.rows)
                except _REFUSALS as exc:
                    if not step.tentative:
                        raise
                    step = _refuse(steps, exc)
                    continue
                rows: Rows = []
            else:
                cur.execute(QUERIES[step.name], step.params)
                rows = cur.fetchall() if _has_rows(cur) else []
            step = _advance(steps, rows)
        return step.value


async def _drive_async(conn: psycopg.AsyncConnection[Any], steps: Steps[R]) -> R:
    async with conn.cursor(row_factory=dict_row) as cur:
        _json_loaders(cur)
        step = _advance(steps, None)
        while isinstance(step, Query | Copy):
            if isinstance(step, Copy):
                try:
                    async with (
                        conn.transaction() if step.tentative else nullcontext(),
                        cur.copy(QUERIES[step.name]) as copy,
                    ):
                        await copyrows.write_rows_async(copy, step.rows)
                except _REFUSALS as exc:
                    if not step.tentative:
                        raise
                    step = _refuse(steps, exc)
                    continue
                rows: Rows = []
            else:
                await cur.execute(QUERIES[step.name], step.params)
                rows = await cur.fetchall() if _has_rows(cur) else []
            step = _advance(steps, rows)
        return step.value


def _has_rows(cur: psycopg.Cursor[Any] | psycopg.AsyncCursor[Any]) -> bool:
    """Whether the statement returns rows (even none): read from the result's status,
    as ``cur.description`` would build a Column object per column to say so."""
    result = cur.pgresult
    return result is not None and result.status == ExecStatus.TUPLES_OK


@dataclass(frozen=True)
class _Done(Generic[R]):
    value: R


def _advance(steps: Steps[R], rows: Rows | None) -> Step | _Done[R]:
    """The plan's next step, sent the rows of the last one (None: its first)."""
    try:
        return next(steps) if rows is None else steps.send(rows)
    except StopIteration as done:
        return _Done(done.value)


def _refuse(steps: Steps[R], exc: psycopg.Error) -> Step | _Done[R]:
    """The plan's next step after its tentative step was refused with ``exc`` (a plan
    that lets the refusal out raises the server's error, as an untentative step's)."""
    try:
        return steps.throw(Refused(exc))
    except StopIteration as done:
        return _Done(done.value)
    except Refused as refused:
        raise refused.cause from None
