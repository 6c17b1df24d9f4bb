"""Handlers for the acceptance tests: ``--app tests.acceptance.poison_app:registry``.

- ``poison``: kills its worker process (``os._exit(1)``: no cleanup, no shutdown,
  like a segfaulting C extension or the OOM killer). ``{"after_ms": int}`` waits
  first, so that jobs claimed in the same batch finish and are written before the
  crash; the test is about the poison pill, not about its collateral.
- ``block-loop``: an async handler that blocks its worker's event loop for
  ``{"ms": int}`` with ``time.sleep``, the mistake ``deadman.loopwatch`` names.
"""

from __future__ import annotations

import asyncio
import os
import time

from deadman.model import Job
from deadman.registry import Registry
from deadman.worker.context import JobContext

registry = Registry()


@registry.handler("poison")
async def poison(job: Job, ctx: JobContext) -> None:
    payload = job.payload if isinstance(job.payload, dict) else {}
    after_ms = int(payload.get("after_ms", 0))
    if after_ms > 0:
        await asyncio.sleep(after_ms / 1000)
    os._exit(1)


@registry.handler("block-loop")
async def block_loop(job: Job, ctx: JobContext) -> None:
    time.sleep(int(job.payload["ms"]) / 1000)  # noqa: ASYNC251 - the mistake under test
