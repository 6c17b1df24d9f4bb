"""The operators scenario's journal: every action the operator sent, with the database
clock (and the last lease token) read just before it and just after its answer."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg

from deadman.chaos.app import OPS
from deadman.chaos.verify_ops import Ack


@dataclass(frozen=True)
class Clock:
    """The database clock and the last lease token handed out, read together."""

    now: datetime
    token: int


class DbClock:
    """The operator's own connection, for the clock around every action and for how
    much is left to do; a connection that failed is dropped, and the next clock read
    makes a new one."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self._conn: psycopg.AsyncConnection[Any] | None = None

    async def now(self) -> Clock | None:
        """The database clock and token sequence, or None if they cannot be read now."""
        try:
            if self._conn is None or self._conn.closed:
                self._conn = await psycopg.AsyncConnection.connect(
                    self.dsn, autocommit=True, connect_timeout=5
                )
            cur = await self._conn.execute(OPS["operators_clock"])
            row = await cur.fetchone()
            return None if row is None else Clock(row[0], int(row[1]))
        except psycopg.Error:
            self._conn = None
            return None

    async def unfinished(self) -> int | None:
        """Jobs not final yet; None when unknown (no connection: ``now`` reconnects)."""
        try:
            if self._conn is None or self._conn.closed:
                return None
            cur = await self._conn.execute(OPS["operators_unfinished"])
            row = await cur.fetchone()
        except psycopg.Error:
            self._conn = None
            return None
        return None if row is None else int(row[0])

    async def close(self) -> None:
        if self._conn is not None:
            await self._conn.close()


class Journal:
    """Every operator action the harness sent (thread-safe), in order; ``statuses``
    counts the answers ("<action> <status>") and ``errors`` what went wrong, for the
    report and the harness's checks."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self.acks: list[Ack] = []
        self.statuses: Counter[str] = Counter()
        self.errors: list[str] = []

    def add(
        self,
        kind: str,
        acked: bool,
        via: str,
        lo: Clock,
        hi: Clock | None,
        *,
        job_id: int | None = None,
        queue: str | None = None,
        state: str | None = None,
        token: int | None = None,
    ) -> None:
        with self._lock:
            self.acks.append(
                Ack(
                    len(self.acks) + 1,
                    kind,
                    acked,
                    via,
                    job_id,
                    queue,
                    state,
                    token,
                    lo.now,
                    lo.token,
                    None if hi is None else hi.now,
                    round(self._clock(), 3),
                )
            )
