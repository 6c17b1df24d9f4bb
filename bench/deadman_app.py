"""Handlers for ``deadman worker --app bench.deadman_app:registry``.

- ``bench_mark``: records its start (see bench.common.record) and returns; payload
  ``{"i": n, "t": intended_send_time}``.
- ``bench_hold``: records its start as ``(job id, rescues)``; on a job's first run
  (rescues == 0) it sleeps ``payload.ms`` so the worker can be killed holding it;
  once rescued it returns at once.
"""

from __future__ import annotations

import asyncio
from typing import Any

from bench.common import record
from deadman import Registry
from deadman.model import Job

registry = Registry()


@registry.handler("bench_mark")
async def bench_mark(job: Job, ctx: Any) -> None:
    record(job.payload["i"], job.payload["t"])


@registry.handler("bench_hold")
async def bench_hold(job: Job, ctx: Any) -> None:
    record(job.id, float(job.rescues))
    if job.rescues == 0:
        await asyncio.sleep(job.payload["ms"] / 1000)
