"""``AsyncShardedClient``: :class:`deadman.shards.ShardedClient`'s routing for asyncio
applications, one :class:`deadman.AsyncClient` per shard; the same calls, awaited,
the same refusals (:mod:`deadman.shards.routing` decides both clients' shards)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Mapping
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any, TypedDict, Unpack

import psycopg

from deadman.aclient import AsyncClient
from deadman.clientcore.options import JobOptions
from deadman.config import Settings
from deadman.connections import AsyncJoinable
from deadman.db.pool import async_pool
from deadman.errors import DatabaseUnavailable, translate
from deadman.model import Job, Workflow
from deadman.shards.ids import acheck_range
from deadman.shards.routing import Router
from deadman.shards.shardmap import Shard
from deadman.store import NewJob
from deadman.store.limits import Limit

Nodes = Mapping[str, NewJob]
Edges = Iterable[tuple[str, str]]


class _WorkflowKeys(TypedDict, total=False):
    idempotency_key: str | None
    conn: AsyncJoinable | None


class _LimitKeys(TypedDict, total=False):
    concurrency: int | None
    rate: tuple[int, timedelta | float] | None


class _AsyncShardClient(AsyncClient):
    """The shard's async client; its pool gives up after ``timeout`` seconds."""

    def __init__(self, shard: Shard, settings: Settings, timeout: float) -> None:
        super().__init__(shard.url, settings=settings)
        self._name = f"deadman-async-shard-{shard.name}"
        self._timeout = timeout

    def _new_pool(self) -> Any:
        return async_pool(self.dsn, name=self._name, timeout=self._timeout)


class AsyncShardedClient(Router[AsyncClient]):
    """Safe to share between the tasks of one event loop; ``async with`` it or
    :meth:`close` it. As :class:`~deadman.shards.ShardedClient` in all else."""

    def _client_of(self, shard: Shard, settings: Settings) -> AsyncClient:
        return _AsyncShardClient(shard, settings, self._timeout)

    async def enqueue(
        self,
        type: str,
        payload: Any = None,
        *,
        conn: AsyncJoinable | None = None,
        **options: Unpack[JobOptions],
    ) -> Job:
        shard = self._shard_of_jobs([self.job(type, payload, **options)])
        async with self._on(shard) as client:
            return await client.enqueue(type, payload, conn=conn, **options)

    async def enqueue_many(
        self, jobs: Iterable[NewJob], *, conn: AsyncJoinable | None = None
    ) -> list[int]:
        batch = list(jobs)
        if not batch:
            return []
        async with self._on(self._shard_of_jobs(batch)) as client:
            return await client.enqueue_many(batch, conn=conn)

    async def workflow(
        self, name: str, nodes: Nodes, edges: Edges = (), **given: Unpack[_WorkflowKeys]
    ) -> Workflow:
        """``idempotency_key=``, ``conn=`` as :meth:`deadman.AsyncClient.workflow`."""
        shard = self._shard_of_jobs(list(nodes.values()), f"workflow {name}")
        async with self._on(shard) as c:
            return await c.workflow(name, nodes, edges, **given)

    async def get(self, job_id: int, *, conn: AsyncJoinable | None = None) -> Job | None:
        async with self._on(self.map.for_id(job_id)) as client:
            return await client.get(job_id, conn=conn)

    async def get_workflow(
        self, workflow_id: int, *, conn: AsyncJoinable | None = None
    ) -> Workflow | None:
        async with self._on(self.map.for_id(workflow_id)) as client:
            return await client.get_workflow(workflow_id, conn=conn)

    async def cancel(self, job_id: int, *, conn: AsyncJoinable | None = None) -> Job:
        async with self._on(self.map.for_id(job_id)) as client:
            return await client.cancel(job_id, conn=conn)

    async def retry(self, job_id: int, *, conn: AsyncJoinable | None = None) -> Job:
        async with self._on(self.map.for_id(job_id)) as client:
            return await client.retry(job_id, conn=conn)

    async def wait(self, job_id: int, timeout: float) -> Job:
        async with self._on(self.map.for_id(job_id)) as client:
            return await client.wait(job_id, timeout)

    async def set_limit(self, key: str, *, queue: str, **limit: Unpack[_LimitKeys]) -> Limit:
        """``concurrency=``, ``rate=`` as :meth:`deadman.AsyncClient.set_limit`, on
        ``queue``'s shard."""
        async with self._on(self.map.for_queue(queue)) as client:
            return await client.set_limit(key, **limit)

    async def limit(self, key: str, *, queue: str) -> Limit | None:
        async with self._on(self.map.for_queue(queue)) as client:
            return await client.limit(key)

    async def delete_limit(self, key: str, *, queue: str) -> bool:
        async with self._on(self.map.for_queue(queue)) as client:
            return await client.delete_limit(key)

    async def limits(self, *, queue: str) -> list[Limit]:
        async with self._on(self.map.for_queue(queue)) as client:
            return await client.limits()

    async def close(self) -> None:
        for client in self._clients.values():
            await client.close()

    async def __aenter__(self) -> AsyncShardedClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @asynccontextmanager
    async def _on(self, shard: Shard) -> AsyncIterator[AsyncClient]:
        """The shard's client, its ids checked once; its outage as ShardUnavailable."""
        rested = self._refuse_if_resting(shard)
        try:
            if rested:
                pool = self._clients[shard.name]._pool
                if pool is not None:  # (no pool yet: nothing to check)
                    await pool.check()
            if not self._is_checked(shard):
                timeout = max(1, round(self._timeout))
                with translate():
                    conn = await psycopg.AsyncConnection.connect(shard.url, connect_timeout=timeout)
                    async with conn:
                        await acheck_range(conn, shard.index, shard.name)
                self._checked_now(shard)
            yield self._clients[shard.name]
        except DatabaseUnavailable as exc:
            raise self._unavailable(shard, exc) from exc
