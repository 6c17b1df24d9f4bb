"""The async store's connection handling: a pool, one statement per call in
autocommit (or a plan of several, deadman.store.plan), errors translated where the
connection is taken, transient trouble retried."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any, LiteralString, Self, TypeVar

from psycopg.rows import DictRow, tuple_row
from psycopg_pool import AsyncConnectionPool
from tenacity import (
    AsyncRetrying,
    retry_if_exception_type,
    stop_after_delay,
    wait_exponential,
    wait_random,
)

from deadman.db.pool import async_pool
from deadman.db.queries import QUERIES
from deadman.errors import DatabaseUnavailable, translate
from deadman.store.conn import AsyncConn
from deadman.store.plan import Plan, run_async

R = TypeVar("R")


class AsyncBase:
    """Async access for the worker and the API, over a connection pool.

    Single-statement operations run in autocommit and are retried on transient
    connection trouble (a Postgres restart, a killed backend) for up to
    ``retry_s`` seconds; the pool replaces connections that are no longer usable.
    Retrying a fenced write is safe: if the first try had committed, the retry
    matches no row and reports the lease as lost, never a double effect.
    """

    def __init__(self, pool: AsyncConnectionPool[AsyncConn], retry_s: float = 30.0) -> None:
        self.pool = pool
        self.retry_s = retry_s

    @classmethod
    def create(
        cls,
        dsn: str,
        *,
        min_size: int = 1,
        max_size: int = 10,
        retry_s: float = 30.0,
        timeout: float = 10.0,
    ) -> Self:
        """``timeout``: longest wait for a pooled connection; a worker keeps it well
        under its lease trust window so a stalled pool surfaces before leases lapse."""
        pool = async_pool(
            dsn, name="deadman", min_size=min_size, max_size=max_size, timeout=timeout
        )
        return cls(pool, retry_s=retry_s)

    async def open(self, wait: bool = True, timeout: float = 30.0) -> None:
        await self.pool.open(wait=wait, timeout=timeout)

    async def close(self) -> None:
        await self.pool.close()

    async def _all(
        self,
        name: LiteralString,
        params: dict[str, Any],
        retry_s: float | None = None,
        *,
        prepare: bool | None = None,
    ) -> list[DictRow]:
        return await self._retried(lambda: self._once(name, params, prepare), retry_s)

    async def _plan(self, plan: Plan[R], retry_s: float | None = None) -> R:
        """``plan`` (deadman.store.plans) on a pooled connection, retried whole as
        ``_all`` retries one statement (a fresh run of its steps each try)."""

        async def once() -> R:
            with translate():
                async with self.pool.connection() as conn:
                    return await run_async(conn, plan)

        return await self._retried(once, retry_s)

    async def _retried(self, attempt: Callable[[], Awaitable[R]], retry_s: float | None) -> R:
        """``attempt()``, tried again on DatabaseUnavailable for up to ``retry_s``
        seconds (None: the store's)."""
        # The first try runs outside tenacity: building and driving its retry state
        # costs ~0.15 ms per statement (measured), on every claim's critical path,
        # and almost every statement succeeds at once. Only a failure pays for it.
        started = time.monotonic()
        try:
            return await attempt()
        except DatabaseUnavailable:
            budget = (self.retry_s if retry_s is None else retry_s) - (time.monotonic() - started)
            if budget <= 0:
                raise
        await asyncio.sleep(random.uniform(0.05, 0.1))  # the wait tenacity puts after try 1
        async for retry in AsyncRetrying(
            retry=retry_if_exception_type(DatabaseUnavailable),
            stop=stop_after_delay(budget),
            wait=wait_exponential(multiplier=0.05, max=2.0) + wait_random(0, 0.05),
            reraise=True,
        ):
            with retry:
                return await attempt()
        raise AssertionError("unreachable")  # pragma: no cover

    async def _tuples(
        self, name: LiteralString, params: dict[str, Any], retry_s: float | None = None
    ) -> tuple[tuple[str, ...], list[tuple[Any, ...]]]:
        """As :meth:`_all`, with each row a tuple and the column names once: a claim's
        rows, read by a :class:`deadman.model.JobReader` without a dict per row.
        ``retry_s=0``: tried once (a DatabaseUnavailable is raised as it comes)."""
        return await self._retried(lambda: self._once_tuples(name, params), retry_s)

    async def _once(
        self, name: LiteralString, params: dict[str, Any], prepare: bool | None
    ) -> list[DictRow]:
        with translate():
            async with self.pool.connection() as conn:
                cur = await conn.execute(QUERIES[name], params, prepare=prepare)
                return await cur.fetchall() if cur.description else []

    async def _once_tuples(
        self, name: LiteralString, params: dict[str, Any]
    ) -> tuple[tuple[str, ...], list[tuple[Any, ...]]]:
        with translate():
            async with self.pool.connection() as conn:
                cur = conn.cursor(row_factory=tuple_row)
                await cur.execute(QUERIES[name], params)
                names = tuple(c.name for c in cur.description or ())
                return names, await cur.fetchall()
