"""``ShardedClient``: one :class:`deadman.Client` per shard, and the routing between
them. A call goes to the shard of the queue it names (enqueue, enqueue_many,
workflow, limits) or of the id it names (get, cancel, retry, wait, get_workflow);
every call is the shard's own client's, unchanged, so a shard behaves exactly as an
unsharded Deadman does. Workers need nothing new: a fleet per shard, with that
shard's ``DEADMAN_DATABASE_URL`` and its queues.

What stays within one shard, and is refused with :class:`CrossShard` when it would
not: a workflow (its nodes' queues), an ``enqueue_many`` batch (one COPY, one
transaction: splitting it would give up its all-or-nothing), a dependency
(``depends_on`` an id of another shard), a limit (set on the shard of the queue given;
a key whose jobs are on two shards is two limits, one per shard).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from datetime import timedelta
from typing import Any, Unpack

import psycopg

from deadman.client import Client
from deadman.clientcore.options import JobOptions
from deadman.config import Settings
from deadman.connections import Joinable
from deadman.db.pool import sync_pool
from deadman.errors import DatabaseUnavailable, translate
from deadman.model import Job, Workflow
from deadman.shards.ids import check_range
from deadman.shards.routing import Router
from deadman.shards.shardmap import Shard
from deadman.store import NewJob
from deadman.store.limits import Limit


class _ShardClient(Client):
    """The shard's client, whose pool gives up after ``timeout`` seconds (the plain
    client waits 30 s: right for one database, too long when the others are up)."""

    def __init__(self, shard: Shard, settings: Settings, timeout: float) -> None:
        super().__init__(shard.url, settings=settings)
        self._name = f"deadman-shard-{shard.name}"
        self._timeout = timeout

    def _new_pool(self) -> Any:
        return sync_pool(self.dsn, name=self._name, max_size=4, timeout=self._timeout)


class ShardedClient(Router[Client]):
    """Thread-safe, as :class:`deadman.Client`. ``shards`` defaults to the map in
    ``DEADMAN_SHARDS``. Before its first call to a shard it checks, once, that the
    shard's database hands out that shard's ids (``deadman shards init``)."""

    def _client_of(self, shard: Shard, settings: Settings) -> Client:
        return _ShardClient(shard, settings, self._timeout)

    def enqueue(
        self,
        type: str,
        payload: Any = None,
        *,
        conn: Joinable | None = None,
        **options: Unpack[JobOptions],
    ) -> Job:
        """:meth:`deadman.Client.enqueue` on the shard of ``queue``."""
        new = self.job(type, payload, **options)
        with self._on(self._shard_of_jobs([new])) as client:
            return client.enqueue(type, payload, conn=conn, **options)

    def enqueue_many(self, jobs: Iterable[NewJob], *, conn: Joinable | None = None) -> list[int]:
        """:meth:`deadman.Client.enqueue_many` on the one shard that holds every job's
        queue; CrossShard when they span shards (group them with :meth:`by_shard`)."""
        batch = list(jobs)
        if not batch:
            return []
        with self._on(self._shard_of_jobs(batch)) as client:
            return client.enqueue_many(batch, conn=conn)

    def workflow(
        self,
        name: str,
        nodes: Mapping[str, NewJob],
        edges: Iterable[tuple[str, str]] = (),
        *,
        idempotency_key: str | None = None,
        conn: Joinable | None = None,
    ) -> Workflow:
        """:meth:`deadman.Client.workflow` on the shard of its nodes' queues;
        CrossShard when they are in queues of different shards."""
        with self._on(self._shard_of_jobs(list(nodes.values()), f"workflow {name}")) as c:
            return c.workflow(name, nodes, edges, idempotency_key=idempotency_key, conn=conn)

    def get(self, job_id: int, *, conn: Joinable | None = None) -> Job | None:
        with self._on(self.map.for_id(job_id)) as client:
            return client.get(job_id, conn=conn)

    def get_workflow(self, workflow_id: int, *, conn: Joinable | None = None) -> Workflow | None:
        with self._on(self.map.for_id(workflow_id)) as client:
            return client.get_workflow(workflow_id, conn=conn)

    def cancel(self, job_id: int, *, conn: Joinable | None = None) -> Job:
        with self._on(self.map.for_id(job_id)) as client:
            return client.cancel(job_id, conn=conn)

    def retry(self, job_id: int, *, conn: Joinable | None = None) -> Job:
        with self._on(self.map.for_id(job_id)) as client:
            return client.retry(job_id, conn=conn)

    def wait(self, job_id: int, timeout: float) -> Job:
        with self._on(self.map.for_id(job_id)) as client:
            return client.wait(job_id, timeout)

    # -- limits: on the shard of the queue whose jobs they limit --------------------

    def set_limit(
        self,
        key: str,
        *,
        queue: str,
        concurrency: int | None = None,
        rate: tuple[int, timedelta | float] | None = None,
    ) -> Limit:
        """:meth:`deadman.Client.set_limit` on ``queue``'s shard: it limits the jobs
        with ``limit_key=key`` there, and only there."""
        with self._on(self.map.for_queue(queue)) as client:
            return client.set_limit(key, concurrency=concurrency, rate=rate)

    def limit(self, key: str, *, queue: str) -> Limit | None:
        with self._on(self.map.for_queue(queue)) as client:
            return client.limit(key)

    def delete_limit(self, key: str, *, queue: str) -> bool:
        with self._on(self.map.for_queue(queue)) as client:
            return client.delete_limit(key)

    def limits(self, *, queue: str) -> list[Limit]:
        with self._on(self.map.for_queue(queue)) as client:
            return client.limits()

    # -- life -----------------------------------------------------------------------

    def close(self) -> None:
        for client in self._clients.values():
            client.close()

    def __enter__(self) -> ShardedClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _on(self, shard: Shard) -> Iterator[Client]:
        """The shard's client, its ids checked once; its outage as ShardUnavailable."""
        rested = self._refuse_if_resting(shard)
        try:
            pool = self._clients[shard.name]._pool
            if rested and pool is not None:  # (no pool yet: nothing to check)
                pool.check()
            if not self._is_checked(shard):
                timeout = max(1, round(self._timeout))
                with translate(), psycopg.connect(shard.url, connect_timeout=timeout) as conn:
                    check_range(conn, shard.index, shard.name)
                self._checked_now(shard)
            yield self._clients[shard.name]
        except DatabaseUnavailable as exc:
            raise self._unavailable(shard, exc) from exc
