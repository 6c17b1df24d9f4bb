"""LISTEN for ``deadman_jobs`` on a dedicated connection and wake the producer; and
for ``deadman_cancel`` (a running job's cancel was requested) to abort its handler
at once instead of at the next heartbeat.

Notifications are an accelerator, never the source of truth: if the connection
drops, the producer's polling still finds every job, and we reconnect in the
background with backoff.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence

import psycopg

from deadman import logs
from deadman.db.queries import QUERIES

log = logs.get("deadman.listener")

CHANNEL = "deadman_jobs"
CANCEL_CHANNEL = "deadman_cancel"


class Listener:
    def __init__(
        self,
        dsn: str,
        queues: Sequence[str],
        on_wake: Callable[[], None],
        on_cancel: Callable[[int], None] | None = None,
    ) -> None:
        self._dsn = dsn
        self._queues = set(queues)
        self._on_wake = on_wake
        self._on_cancel = on_cancel
        self._stop = asyncio.Event()
        self.connected = asyncio.Event()
        self.received = 0

    def stop(self) -> None:
        self._stop.set()

    async def run(self) -> None:
        delay = 0.1
        while not self._stop.is_set():
            try:
                await self._listen()
                delay = 0.1
            except (psycopg.OperationalError, psycopg.InterfaceError, OSError) as exc:
                self.connected.clear()
                log.warning("listener_disconnected", error=str(exc), retry_in_s=delay)
                # Something may have been enqueued while we were deaf: poll now.
                self._on_wake()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), delay)
                delay = min(delay * 2, 5.0)

    async def _listen(self) -> None:
        async with await psycopg.AsyncConnection.connect(self._dsn, autocommit=True) as conn:
            await conn.execute(QUERIES["listen_jobs"])
            if self._on_cancel is not None:
                await conn.execute(QUERIES["listen_cancel"])
            self.connected.set()
            self._on_wake()  # anything enqueued before LISTEN took effect
            while not self._stop.is_set():
                # Wake up at least every second to notice stop(); timeouts also probe
                # the connection, so a dead socket surfaces as an error here.
                async for note in conn.notifies(timeout=1.0):
                    self.received += 1
                    if note.channel == CANCEL_CHANNEL:
                        # Every worker hears every cancel; the one holding the job
                        # acts, the rest ignore it. A missed one is caught by the
                        # heartbeat, which reads cancel_requested.
                        if self._on_cancel is not None and note.payload.isdigit():
                            self._on_cancel(int(note.payload))
                    elif note.payload in self._queues:
                        self._on_wake()
                await conn.execute(QUERIES["ping"])
