"""``deadman.AsyncClient``: :class:`deadman.Client`'s calls, awaited, for asyncio
applications (FastAPI, Starlette, aiohttp).

``await aclient.enqueue(..., conn=their_connection)`` joins the caller's transaction
on a psycopg ``AsyncConnection``, or a SQLAlchemy ``AsyncConnection`` /
``AsyncSession`` on ``postgresql+psycopg://`` (:mod:`deadman.connections`). The calls
are the sync client's, written once (:mod:`deadman.clientcore`); only how they run
differs: awaited, on the caller's connection or on the client's own pool.
"""

from __future__ import annotations

import asyncio
from typing import TypeVar

import psycopg
from psycopg_pool import AsyncConnectionPool

from deadman import connections
from deadman.clientcore.core import Awaiting, Call
from deadman.clientcore.surface import Operations
from deadman.config import Settings
from deadman.db.pool import AsyncConn, async_pool, ready_async_pool
from deadman.errors import translate
from deadman.model import Job
from deadman.store import plans
from deadman.store.plan import run_async
from deadman.waiting import AsyncWaiter

R = TypeVar("R")


class AsyncClient(Operations, Awaiting):
    """An asyncio client, safe to share between tasks of one event loop; use it as
    ``async with AsyncClient(dsn) as aclient:`` or call :meth:`close`. Its pool is
    opened at first use; ``conn=`` takes an async connection."""

    def __init__(self, dsn: str | None = None, *, settings: Settings | None = None) -> None:
        super().__init__(dsn, settings=settings)
        self._pool: AsyncConnectionPool[AsyncConn] | None = None
        self._pool_lock = asyncio.Lock()
        self._waiter: AsyncWaiter | None = None

    def _new_pool(self) -> AsyncConnectionPool[AsyncConn]:
        # autocommit, as the sync client's: one statement, one round trip
        return async_pool(self.dsn, name="deadman-async-client")

    async def _get_pool(self) -> AsyncConnectionPool[AsyncConn]:
        if self._pool is not None:  # the path of every call after the first
            return self._pool
        async with self._pool_lock:
            if self._pool is None:
                self._pool = await ready_async_pool(self._new_pool())
            return self._pool

    async def wait(self, job_id: int, timeout: float) -> Job:
        """As :meth:`deadman.Client.wait`, awaited; the flag and the reads share this
        client's pool, the listener is one more connection, opened at the first wait."""
        if self._waiter is None:
            self._waiter = AsyncWaiter(self.dsn, pool=await self._get_pool())
        return await self._waiter.wait(job_id, timeout)

    async def close(self) -> None:
        if self._waiter is not None:
            await self._waiter.close()
            self._waiter = None
        async with self._pool_lock:
            if self._pool is not None:
                await self._pool.close()
                self._pool = None

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _run(self, call: Call[R]) -> R:
        if call.conn is not None:
            return await run_async(await self._joined(call.conn), call.plan)
        pool = await self._get_pool()
        with translate():
            async with pool.connection() as own:
                return await run_async(own, call.plan)

    async def _joined(self, conn: connections.Joinable) -> psycopg.AsyncConnection[object]:
        """The caller's psycopg connection, once it is known to reach our database."""
        raw = await connections.async_connection(conn)
        if raw not in self._same_database:
            theirs = await run_async(raw, plans.server_identity())
            ours = await self._run(Call(plans.server_identity()))
            connections.check_same_database(theirs, ours, self.dsn)
            self._same_database.add(raw)
        return raw
