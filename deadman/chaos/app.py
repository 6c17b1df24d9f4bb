"""The handler chaos jobs run: ``deadman worker --app deadman.chaos.app:registry``.

``chaos-effect`` (payload ``{"ms": int}``):

1. records the invocation in ``deadman.chaos_invocations``, in autocommit on a
   connection of its own, so the record survives whatever happens next (SIGKILL,
   lost lease, rolled-back transaction): the verifier counts duplicate executions;
2. sleeps ``ms`` milliseconds (a window for faults to land mid-handler);
3. writes one row to ``deadman.effects`` inside ``ctx.transaction()``: the effect
   commits exactly when the fenced completion does, or not at all.

``chaos-flaky`` (payload ``{"ms": int, "p": float}``) is the same, but after its sleep
an attempt fails with probability ``p``, reproducibly from (job id, attempt) as the
built-in ``flaky``: the operators scenario's source of dead letters to replay, and
of attempts that end 'retrying' while a cancel lands on them.

With ``DEADMAN_CHAOS_UNSAFE=1`` (``deadman chaos --unsafe-effects``) step 3 writes the
effect in autocommit outside the job's transaction and lets the completer finish the
job afterwards, as a careless handler would. That is the negative control: a worker
killed between the effect and the completion, or a zombie that wakes up after its
lease was rescued, doubles the effect, and the verifier must say so.
"""

from __future__ import annotations

import asyncio
import os
import random
from importlib import resources
from typing import Any, LiteralString

from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_delay, wait_exponential

from deadman.db.pool import async_pool
from deadman.db.queries import parse
from deadman.errors import DatabaseUnavailable, translate
from deadman.model import Job
from deadman.registry import Registry
from deadman.store import AsyncStore
from deadman.worker.context import JobContext

UNSAFE_ENV = "DEADMAN_CHAOS_UNSAFE"
#: How long recording an invocation keeps retrying through a Postgres restart before
#: the handler gives up (the attempt then fails and is retried like any other).
RECORD_RETRY_S = 20.0

OPS: dict[str, LiteralString] = parse(
    resources.files("deadman.chaos").joinpath("ops.sql").read_text(encoding="utf-8")
)

registry = Registry()


class _Evidence:
    """This process's own small pool, apart from the worker's: the invocation record
    must not share a connection (or a transaction) with the job's fenced one."""

    def __init__(self) -> None:
        self._store: AsyncStore | None = None
        self._lock = asyncio.Lock()

    async def store(self) -> AsyncStore:
        async with self._lock:
            if self._store is None:
                # Made like every pool (autocommit, dict rows; nothing here reads a
                # row). psycopg_pool gives up on a slot after reconnect_timeout; 0
                # would mean at the first failed reconnect.
                pool = async_pool(
                    os.environ.get("DEADMAN_DATABASE_URL", ""),
                    name="deadman-chaos",
                    max_size=4,
                    reconnect_timeout=300.0,
                )
                await pool.open(wait=False)
                self._store = AsyncStore(pool)
            return self._store


_evidence = _Evidence()


async def _autocommit(name: LiteralString, params: dict[str, Any]) -> None:
    """Run one of OPS in autocommit, retrying through connection trouble."""
    store = await _evidence.store()
    async for attempt in AsyncRetrying(
        retry=retry_if_exception_type(DatabaseUnavailable),
        stop=stop_after_delay(RECORD_RETRY_S),
        wait=wait_exponential(multiplier=0.05, max=1.0),
        reraise=True,
    ):
        with attempt, translate():
            async with store.pool.connection() as conn:
                await conn.execute(OPS[name], params)


async def _unsafe_effect(job: Job, ctx: JobContext) -> None:
    store = await _evidence.store()
    with translate():
        async with store.pool.connection() as conn:
            await store.effect_insert(conn, job.id, ctx.lease_token)


@registry.handler("chaos-effect")
async def chaos_effect(job: Job, ctx: JobContext) -> dict[str, Any] | None:
    return await _effect(job, ctx, fail_p=0.0)


class ChaosFailure(Exception):
    """Raised by ``chaos-flaky`` on the attempts its draw says fail."""


@registry.handler("chaos-flaky")
async def chaos_flaky(job: Job, ctx: JobContext) -> dict[str, Any] | None:
    payload = job.payload if isinstance(job.payload, dict) else {}
    return await _effect(job, ctx, fail_p=float(payload.get("p", 0.5)))


async def _effect(job: Job, ctx: JobContext, fail_p: float) -> dict[str, Any] | None:
    payload = job.payload if isinstance(job.payload, dict) else {}
    ms = int(payload.get("ms", 0))
    await _autocommit(
        "invocation_record",
        {"job_id": job.id, "lease_token": ctx.lease_token, "worker": ctx.worker_id},
    )
    if ms > 0:
        await asyncio.sleep(ms / 1000)
    # Reproducible from (job id, attempt), as the built-in ``flaky``.
    if fail_p > 0 and random.Random(f"{job.id}:{job.attempt}").random() < fail_p:
        raise ChaosFailure(f"chaos-flaky: attempt {job.attempt} failed (p={fail_p})")
    if os.environ.get(UNSAFE_ENV) == "1":
        await _unsafe_effect(job, ctx)
        return {"effect": "unsafe", "lease_token": ctx.lease_token}
    async with ctx.transaction() as conn:
        store = await _evidence.store()  # effect_insert only uses the connection given
        await store.effect_insert(conn, job.id, ctx.lease_token)
        ctx.result = {"effect": "fenced", "lease_token": ctx.lease_token}
    return None
