"""Insert jobs in any state, backdated, with raw SQL; and open stores for async tests.

Tests never wait for something to become stale: they write the row as it would look
after the wait (a running job whose lease lapsed 10 s ago, a job that succeeded 25 h
ago). Every offset is relative to the database clock (``now()``), the same clock the
queries use, so a test cannot be fooled by a skewed local clock.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

import psycopg
from psycopg.rows import DictRow, dict_row
from psycopg.types.json import Jsonb

from deadman.store import AsyncStore

T = TypeVar("T")

ALL_STATES = (
    "waiting",
    "scheduled",
    "queued",
    "running",
    "retrying",
    "succeeded",
    "dead",
    "cancelled",
)
TERMINAL_STATES = ("succeeded", "dead", "cancelled")


@dataclass(frozen=True)
class Inserted:
    id: int
    lease_token: int | None


def connect(dsn: str, *, autocommit: bool = True) -> psycopg.Connection[DictRow]:
    """A dict-row connection; autocommit unless the test drives the transaction."""
    return psycopg.connect(dsn, autocommit=autocommit, row_factory=dict_row)


def insert_job(
    conn: psycopg.Connection[Any],
    *,
    state: str = "queued",
    type: str = "test",
    queue: str = "default",
    priority: int = 0,
    payload: Any = None,
    run_in_s: float = 0.0,
    run_at: datetime | None = None,
    attempt: int | None = None,
    max_attempts: int = 5,
    rescues: int = 0,
    lease_expires_in_s: float = 30.0,
    lease_worker: str = "factory-worker",
    started_ago_s: float = 1.0,
    finished_ago_s: float = 0.0,
    cancel_requested: bool = False,
    idempotency_key: str | None = None,
    timeout_ms: int | None = None,
    last_error: str | None = None,
) -> Inserted:
    """Insert one job exactly as the queue would have left it in ``state``.

    ``run_in_s``: run_at relative to now() (negative: due since), unless ``run_at``
    pins it (for ties). A ``running`` job gets a fresh token from the real sequence
    (so tokens stay globally unique alongside real claims) and ``lease_expires_at =
    now() + lease_expires_in_s`` (negative: lapsed). A terminal job gets
    ``finished_at = now() - finished_ago_s``. The caller's connection decides the
    transaction (``connect()`` gives autocommit).
    """
    if state not in ALL_STATES:
        raise ValueError(f"unknown state {state!r}")
    running = state == "running"
    terminal = state in TERMINAL_STATES
    if attempt is None:
        attempt = 1 if state in ("running", "retrying", "succeeded", "dead") else 0
    started = running or terminal or state == "retrying"
    created_ago = max(started_ago_s, finished_ago_s, -run_in_s, 0.0) + 1.0
    row = conn.execute(
        """
        INSERT INTO deadman.jobs (
            type, queue, priority, payload, state, attempt, max_attempts, rescues,
            timeout_ms, run_at, created_at, started_at, finished_at, idempotency_key,
            lease_token, lease_worker, lease_expires_at, cancel_requested, last_error)
        VALUES (
            %(type)s, %(queue)s, %(priority)s, %(payload)s, %(state)s, %(attempt)s,
            %(max_attempts)s, %(rescues)s, %(timeout_ms)s,
            COALESCE(%(run_at)s::timestamptz, now() + %(run_in_s)s::float8 * interval '1 second'),
            now() - %(created_ago)s::float8 * interval '1 second',
            now() - %(started_ago)s::float8 * interval '1 second',
            now() - %(finished_ago)s::float8 * interval '1 second',
            %(idempotency_key)s,
            CASE WHEN %(running)s THEN nextval('deadman.lease_token_seq') END,
            CASE WHEN %(running)s THEN %(lease_worker)s END,
            now() + %(lease_expires_in)s::float8 * interval '1 second',
            %(cancel_requested)s, %(last_error)s)
        RETURNING id, lease_token
        """,
        {
            "type": type,
            "queue": queue,
            "priority": priority,
            "payload": Jsonb(payload),
            "state": state,
            "attempt": attempt,
            "max_attempts": max_attempts,
            "rescues": rescues,
            "timeout_ms": timeout_ms,
            "run_in_s": run_in_s,
            "run_at": run_at,
            "created_ago": created_ago,
            "started_ago": started_ago_s if started else None,
            "finished_ago": finished_ago_s if terminal else None,
            "idempotency_key": idempotency_key,
            "running": running,
            "lease_worker": lease_worker,
            "lease_expires_in": lease_expires_in_s if running else None,
            "cancel_requested": cancel_requested,
            "last_error": last_error,
        },
    ).fetchone()
    assert row is not None
    values = list(row.values()) if isinstance(row, dict) else list(row)
    return Inserted(id=int(values[0]), lease_token=None if values[1] is None else int(values[1]))


def expire_lease(conn: psycopg.Connection[Any], job_id: int, ago_s: float = 10.0) -> None:
    """Backdate a claimed job's lease: as if its worker stopped renewing ``ago_s`` ago."""
    cur = conn.execute(
        "UPDATE deadman.jobs SET lease_expires_at = now() - %s::float8 * interval '1 second'"
        " WHERE id = %s AND state = 'running'",
        (ago_s, job_id),
    )
    assert cur.rowcount == 1, f"job {job_id} is not running"


def job_row(conn: psycopg.Connection[DictRow], job_id: int) -> DictRow:
    row = conn.execute("SELECT * FROM deadman.jobs WHERE id = %s", (job_id,)).fetchone()
    assert row is not None, f"job {job_id} does not exist"
    return row


def attempt_rows(conn: psycopg.Connection[DictRow], job_id: int) -> list[DictRow]:
    return conn.execute(
        "SELECT * FROM deadman.attempts WHERE job_id = %s ORDER BY lease_token", (job_id,)
    ).fetchall()


def db_now(conn: psycopg.Connection[DictRow]) -> datetime:
    """The database's clock right now (not the transaction's start)."""
    row = conn.execute("SELECT clock_timestamp() AS now").fetchone()
    assert row is not None
    value: datetime = row["now"]
    return value


@asynccontextmanager
async def async_store(dsn: str, *, max_size: int = 4) -> AsyncIterator[AsyncStore]:
    """An opened AsyncStore that does not retry (a test wants the first error)."""
    store = AsyncStore.create(dsn, min_size=1, max_size=max_size, retry_s=0.0)
    await store.open(wait=True, timeout=10.0)
    try:
        yield store
    finally:
        await store.close()


def run_async(make: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run one coroutine to completion from a sync test (no pytest-asyncio here)."""
    return asyncio.run(make())


def with_store(dsn: str, body: Callable[[AsyncStore], Awaitable[T]], *, max_size: int = 4) -> T:
    """``with_store(dsn, lambda store: store.job_claim(...))``: open, run, close."""

    async def main() -> T:
        async with async_store(dsn, max_size=max_size) as store:
            return await body(store)

    return asyncio.run(main())
