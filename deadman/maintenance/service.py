"""The restartable service base: a loop that ticks every ``interval_s`` until stopped;
and the base of the maintenance services, which tick as the leader.

Start and stop are idempotent, and a stopped service can be started again (each
start gets its own stop event, so a stop meant for the last run never ends the
next one). A tick that raises does not end the loop: a standalone ``deadman
rescuer`` that exited on a bug would leave nobody rescuing, and a worker whose
rescuer died would hold its jobs with no one to hand lapsed leases on. The error
is logged (``<name>_error``) and the next tick waits longer, up to
``ERROR_BACKOFF_MAX_S``, so a tick failing on every try does not spin.
"""

from __future__ import annotations

import asyncio
import contextlib
from abc import ABC, abstractmethod
from typing import ClassVar

from deadman import logs
from deadman.config import Settings
from deadman.errors import DatabaseUnavailable
from deadman.maintenance.leadership import Leadership
from deadman.store import AsyncStore

log = logs.get("deadman.maintenance")

#: Longest wait between ticks after a run of failing ones.
ERROR_BACKOFF_MAX_S = 5.0


class Service(ABC):
    """A long-running loop of ``tick()``; subclasses say what one tick does."""

    name: ClassVar[str]

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        #: ticks begun (whether they acted, skipped or failed): for tests and a debugger
        self.ticks = 0
        self._task: asyncio.Task[None] | None = None
        self._stop: asyncio.Event | None = None

    @abstractmethod
    async def tick(self) -> object:
        """One round of work; returns a report of what it did."""

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def start(self) -> None:
        """Begin ticking (the first tick at once); no-op while running."""
        if self.running:
            return
        self._stop = asyncio.Event()
        self._task = asyncio.create_task(self._run(self._stop), name=self.name)

    async def stop(self) -> None:
        """Stop ticking and wait for the tick under way to end; no-op when stopped."""
        task, stop = self._task, self._stop
        if task is None or stop is None:
            return
        stop.set()
        await asyncio.gather(task, return_exceptions=True)
        if self._task is task:
            self._task = self._stop = None

    async def _run(self, stop: asyncio.Event) -> None:
        delay = self.interval_s
        while not stop.is_set():
            self.ticks += 1
            try:
                await self.tick()
                delay = self.interval_s
            except DatabaseUnavailable as exc:
                log.warning(f"{self.name}_db_unavailable", error=str(exc))
            except Exception as exc:
                delay = max(self.interval_s, min(delay * 2, ERROR_BACKOFF_MAX_S))
                log.error(f"{self.name}_error", error=repr(exc)[:500], retry_in_s=delay)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), delay)


class MaintenanceService(Service):
    """A maintenance service (rescuer, expirer, cleaner): ticks once per ``every``
    rescuer intervals (``DEADMAN_RESCUE_S``), and acts only as the leader of ``key``,
    through a Leadership it may share with the process's other services."""

    #: its advisory key (store/maintenance.py): two processes' ticks never act at once
    key: ClassVar[int]
    every: ClassVar[int] = 1

    def __init__(
        self, store: AsyncStore, settings: Settings, leadership: Leadership | None = None
    ) -> None:
        super().__init__(settings.rescue_s * self.every)
        self._store = store
        self._settings = settings
        self.leadership = leadership or Leadership(store)
