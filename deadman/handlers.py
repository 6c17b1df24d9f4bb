"""Built-in handlers, always served by every worker (``--app`` adds yours).

- ``noop``: does nothing.
- ``sleep``: ``{"ms": int}``; cooperative (stops early when cancelled).
- ``fail``: always raises; ``{"message": str}`` optional.
- ``flaky``: ``{"p": float}``; fails with probability p, reproducibly from
  (job id, attempt) so a run can be replayed and reasoned about.
- ``cpu``: ``{"iterations": int}``; burns CPU in a thread (sha256 rounds).
- ``side-effect``: inserts one row into ``deadman.effects`` inside
  ``ctx.transaction()``, so the effect commits exactly when the completion does.
  ``{"sleep_ms": int}`` optional, slept before the effect (sync: in a thread, so a
  paused-and-resumed worker really attempts its late write and is refused).
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import time
from typing import Any

from deadman.model import Job
from deadman.registry import Registry
from deadman.store import SyncStore
from deadman.worker.context import JobContext

builtins = Registry()
_sync_store = SyncStore()


class HandlerFailure(Exception):
    """Raised by the ``fail`` and ``flaky`` handlers."""


def _payload(job: Job) -> dict[str, Any]:
    return job.payload if isinstance(job.payload, dict) else {}


def _int(payload: dict[str, Any], key: str, default: int = 0) -> int:
    value = payload.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise HandlerFailure(f"payload.{key} must be a number")
    return int(value)


@builtins.handler("noop")
async def noop(job: Job, ctx: JobContext) -> None:
    return None


@builtins.handler("sleep")
async def sleep(job: Job, ctx: JobContext) -> dict[str, int]:
    ms = _int(_payload(job), "ms", 100)
    await asyncio.sleep(max(ms, 0) / 1000)
    return {"slept_ms": ms}


@builtins.handler("fail")
async def fail(job: Job, ctx: JobContext) -> None:
    message = _payload(job).get("message") or "the fail handler always fails"
    raise HandlerFailure(str(message))


@builtins.handler("flaky")
async def flaky(job: Job, ctx: JobContext) -> dict[str, int]:
    p = float(_payload(job).get("p", 0.5))
    draw = random.Random(f"{job.id}:{job.attempt}").random()
    if draw < p:
        raise HandlerFailure(f"flaky: failed on attempt {job.attempt} (p={p})")
    return {"succeeded_on_attempt": job.attempt}


@builtins.handler("cpu")
def cpu(job: Job, ctx: JobContext) -> dict[str, str]:
    n = _int(_payload(job), "iterations", 10_000)
    digest = hashlib.sha256(str(job.id).encode()).digest()
    for i in range(n):
        if i % 10_000 == 0 and ctx.cancelled:
            break
        digest = hashlib.sha256(digest).digest()
    return {"digest": digest.hex()[:16]}


@builtins.handler("side-effect")
def side_effect(job: Job, ctx: JobContext) -> None:
    sleep_ms = _int(_payload(job), "sleep_ms", 0)
    if sleep_ms > 0:
        time.sleep(sleep_ms / 1000)
    with ctx.transaction() as conn:
        _sync_store.effect_insert(conn, job.id, ctx.lease_token)
        ctx.result = {"effect": "written", "lease_token": ctx.lease_token}
