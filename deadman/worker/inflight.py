"""The jobs a worker holds right now: what the heartbeat renews and shutdown releases."""

from __future__ import annotations

import asyncio
import contextlib
import enum
from dataclasses import dataclass, field
from typing import Any

from deadman.model import Job
from deadman.worker.context import JobContext


class Abort(enum.Enum):
    """Why the worker cancelled a handler; decides how the attempt is recorded."""

    CANCEL = "cancel"  # a user asked: the attempt ends cancelled
    LEASE_LOST = "lease_lost"  # no longer ours: write nothing, walk away
    SHUTDOWN = "shutdown"  # grace ran out: release back to queued
    HUNG = "hung"  # no ctx.heartbeat() for heartbeat_timeout_ms: the attempt timed out


@dataclass(slots=True)
class Held:
    job: Job
    ctx: JobContext
    task: asyncio.Task[None] | None = None
    is_async: bool = True
    #: Handed to the completer (or committing inside ctx.transaction()): the
    #: completion's own fenced result is authoritative from now on, so a heartbeat
    #: that finds the lease gone is not a loss.
    finishing: bool = False
    abort: Abort | None = None
    slot_released: bool = False
    #: the job's task has begun running: cancelling it now reaches _run's handlers
    started: bool = False
    #: a sync handler's thread; its slot is only given back once it has returned
    thread: asyncio.Future[Any] | None = None
    #: bytes of the result as JSON, once checked (the completer caps a batch's bytes)
    result_bytes: int = 0
    token: int = field(init=False)

    def __post_init__(self) -> None:
        self.token = self.ctx.lease_token


class Inflight:
    def __init__(self) -> None:
        self._held: dict[int, Held] = {}
        self._empty = asyncio.Event()
        self._empty.set()
        self._removed = asyncio.Event()

    def add(self, held: Held) -> None:
        self._held[held.job.id] = held
        self._empty.clear()

    def remove(self, job_id: int) -> None:
        self._held.pop(job_id, None)
        self._removed.set()
        if not self._held:
            self._empty.set()

    def get(self, job_id: int) -> Held | None:
        return self._held.get(job_id)

    def all(self) -> list[Held]:
        return list(self._held.values())

    def leases(self) -> list[tuple[int, int]]:
        return [(h.job.id, h.token) for h in self._held.values()]

    def __len__(self) -> int:
        return len(self._held)

    async def wait_empty(self) -> None:
        await self._empty.wait()

    async def wait_removed(self, timeout: float) -> None:
        """Until the next job leaves (or timeout). Call without awaiting in between
        checking the state you wait to change and calling this."""
        self._removed.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._removed.wait(), timeout)
