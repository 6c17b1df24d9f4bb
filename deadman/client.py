"""``deadman.Client``: enqueue jobs from Python.

``enqueue(..., conn=their_connection)`` runs on the caller's connection (psycopg,
SQLAlchemy or Django: :mod:`deadman.connections`), so the job joins the caller's
transaction: invisible until they commit, gone if they roll back. That is the
transactional-outbox pattern without an outbox table.

Every call is written once (:mod:`deadman.clientcore`) and shared with
:class:`deadman.AsyncClient`; this module only says how a call runs here: blocking,
on the caller's connection or on the client's own pool.
"""

from __future__ import annotations

import threading
from typing import Any, TypeVar

import psycopg
from psycopg_pool import ConnectionPool

from deadman import connections
from deadman.clientcore.core import Blocking, Call
from deadman.clientcore.options import JobOptions
from deadman.clientcore.surface import Operations
from deadman.config import Settings
from deadman.db.pool import ready_sync_pool, sync_pool
from deadman.errors import translate
from deadman.model import Job
from deadman.store import plans
from deadman.store.plan import run_sync
from deadman.waiting import Waiter

__all__ = ["Client", "JobOptions"]
R = TypeVar("R")


class Client(Operations, Blocking):
    """A thread-safe client. ``dsn`` defaults to ``DEADMAN_DATABASE_URL``; its pool is
    opened at first use, and ``conn=`` takes a sync connection."""

    def __init__(self, dsn: str | None = None, *, settings: Settings | None = None) -> None:
        super().__init__(dsn, settings=settings)
        self._pool: ConnectionPool[psycopg.Connection[Any]] | None = None
        self._pool_lock = threading.Lock()
        self._waiter: Waiter | None = None

    def _new_pool(self) -> ConnectionPool[psycopg.Connection[Any]]:
        # Autocommit: a single enqueue is one statement, so it commits in the same
        # round trip (no separate COMMIT: measured in the latency benchmark); the
        # multi-statement plans open their own transaction.
        return sync_pool(self.dsn, name="deadman-client", max_size=4)

    def _get_pool(self) -> ConnectionPool[psycopg.Connection[Any]]:
        with self._pool_lock:
            if self._pool is None:
                self._pool = ready_sync_pool(self._new_pool())
            return self._pool

    def wait(self, job_id: int, timeout: float) -> Job:
        """The job once it has ended (succeeded, dead or cancelled): state, result,
        last_error. Woken by a notification, polled every second as a fallback;
        :class:`deadman.WaitTimeout` after ``timeout`` seconds, :class:`NotFound` at
        once for an unknown id. One listener connection, opened at the first wait and
        shared by every wait of this client."""
        with self._pool_lock:
            if self._waiter is None:
                self._waiter = Waiter(self.dsn)
            waiter = self._waiter
        return waiter.wait(job_id, timeout)

    def close(self) -> None:
        with self._pool_lock:
            waiter, self._waiter = self._waiter, None
            if self._pool is not None:
                self._pool.close()
                self._pool = None
        if waiter is not None:
            waiter.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(self, call: Call[R]) -> R:
        if call.conn is not None:
            return run_sync(self._joined(call.conn), call.plan)
        with translate(), self._get_pool().connection() as own:
            return run_sync(own, call.plan)

    def _joined(self, conn: connections.Joinable) -> psycopg.Connection[Any]:
        """The caller's psycopg connection, once it is known to reach our database."""
        raw = connections.sync_connection(conn)
        if raw not in self._same_database:
            theirs = run_sync(raw, plans.server_identity())
            ours = self._run(Call(plans.server_identity()))
            connections.check_same_database(theirs, ours, self.dsn)
            self._same_database.add(raw)
        return raw
