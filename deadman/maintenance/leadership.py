"""Who leads maintenance: whoever takes the advisory lock for that tick.

Every worker process (and a standalone ``deadman rescuer``) runs the maintenance
services; each tick acts only inside a transaction that won
``pg_try_advisory_xact_lock(716341, key)`` (the query ``rescuer_try_lock``), one
key per service (the rescuer's is 2, as it always was). So leadership needs no
state and no hand-over: it lasts one transaction, a leader that dies releases it
with its connection, and the next tick elects whoever comes first. Two processes'
ticks of one service never act at once; different services do not wait for each
other (a long prune round must not delay a rescue).

A *paused* leader (SIGSTOP, a VM freeze, a partition) would keep the lock for as
long as its transaction stays open, and nothing would be rescued anywhere: the
transaction sets ``idle_in_transaction_session_timeout`` to ``idle_ms``, so the
server ends a session left idle that long and the lock goes with it (DECISIONS 24).
The cost: a leader's tick may never wait ``idle_ms`` between two statements.

One Leadership per process, shared by its services, lets one of their ticks at a
time hold a connection: before the split the rescuer took one connection from the
worker's pool (README's budget counts one), and three services ticking at once
would take three, from the pool the heartbeat needs.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from deadman import logs
from deadman.store.maintenance import MaintenanceStore, MaintenanceTx

log = logs.get("deadman.leadership")

#: A leader idle this long inside its tick's transaction loses its session.
IDLE_MS = 5000


class Leadership:
    """Elects this process for one tick of one service at a time; remembers per key
    whether it last led, to log the changes (not every tick)."""

    def __init__(self, store: MaintenanceStore, *, idle_ms: int = IDLE_MS) -> None:
        self._store = store
        self.idle_ms = idle_ms
        self.leading: dict[int, bool] = {}
        self._turn = asyncio.Lock()  # this process's services: one connection at a time

    @asynccontextmanager
    async def lead(self, key: int) -> AsyncIterator[MaintenanceTx | None]:
        """The leader's transaction for one tick of the service ``key``, or None:
        another process leads it now."""
        async with self._turn, self._store.maintenance_lead(key, self.idle_ms) as tx:
            leading = tx is not None
            if leading != self.leading.get(key, False):
                self.leading[key] = leading
                log.info("leadership_gained" if leading else "leadership_elsewhere", key=key)
            yield tx
