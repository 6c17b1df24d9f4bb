"""Handlers for ``deadman worker --app bench.deadman_app:registry``.

- ``bench_mark``: records its start (see bench.common.record) and returns; payload
  ``{"i": n, "t": intended_send_time}``.
- ``bench_hold``: records its start as ``(job id, rescues)``; on a job's first run
  (rescues == 0) it sleeps ``payload.ms`` so the worker can be killed holding it;
  once rescued it returns at once.
- ``bench_effect``: the exactly-once shape, async: one row into ``deadman.effects``
  and the job's completion in one ``ctx.transaction()`` (the built-in
  ``side-effect`` is the same in a sync handler).
- ``bench_effect_plain``: the same row written the way a peer's handler writes it
  (bench.peers.pgqueuer_bench's ``effect``): one INSERT committed on its own, on a
  connection of the handler's own pool, at least once.
- ``bench_io_<ms>`` for each of bench.common.IO_WAITS_MS: awaits that many ms and
  returns (the io phase: a handler that waits on another service).
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from psycopg_pool import AsyncConnectionPool

from bench.common import IO_WAITS_MS, io_handler, io_name, record
from deadman import Registry
from deadman.db.queries import QUERIES
from deadman.model import Job
from deadman.worker.context import JobContext

registry = Registry()


@registry.handler("bench_mark")
async def bench_mark(job: Job, ctx: Any) -> None:
    record(job.payload["i"], job.payload["t"])


@registry.handler("bench_hold")
async def bench_hold(job: Job, ctx: Any) -> None:
    record(job.id, float(job.rescues))
    if job.rescues == 0:
        await asyncio.sleep(job.payload["ms"] / 1000)


for _ms in IO_WAITS_MS:
    registry.register(f"bench_{io_name(_ms)}", io_handler(_ms))


@registry.handler("bench_effect")
async def bench_effect(job: Job, ctx: JobContext) -> None:
    async with ctx.transaction() as conn:
        await conn.execute(
            QUERIES["effect_insert"], {"job_id": job.id, "lease_token": ctx.lease_token}
        )


#: bench_effect_plain's pool, opened by its first job (the size of the worker's own
#: handler pool at the benchmarked concurrencies)
_plain_pool: AsyncConnectionPool | None = None
_plain_lock = asyncio.Lock()


async def _pool() -> AsyncConnectionPool:
    global _plain_pool
    async with _plain_lock:
        if _plain_pool is None:
            pool = AsyncConnectionPool(
                os.environ["DEADMAN_DATABASE_URL"],
                min_size=1,
                max_size=16,
                kwargs={"autocommit": True},
                open=False,
            )
            await pool.open()
            _plain_pool = pool
    return _plain_pool


@registry.handler("bench_effect_plain")
async def bench_effect_plain(job: Job, ctx: JobContext) -> None:
    pool = _plain_pool or await _pool()
    async with pool.connection() as conn:  # one INSERT, its own commit
        await conn.execute(
            QUERIES["effect_insert"], {"job_id": job.id, "lease_token": ctx.lease_token}
        )
