"""Every connection pool Deadman opens, made in one place: the worker's, the API's,
the handlers', the Python client's. One set of options with one table of defaults, so
the pools cannot drift apart in how they connect or how long they keep trying.

Async pools give dict rows (what the store and handlers read); json and jsonb are
decoded by :mod:`deadman.db.jsoncodec` (orjson where it is exact); every pool's
connections are in autocommit (a single statement commits in its own round trip;
the multi-statement paths open their own transactions). ``reconnect_timeout``: how
long psycopg_pool keeps trying to replace a broken connection before it gives the
slot up (0 would mean: at the first failure); a worker must outlive any outage.

Prepared statements: psycopg prepares a statement once a connection has run it
``PREPARE_THRESHOLD`` times. ``DEADMAN_PREPARE=off`` (read from the environment here,
by :func:`prepare_threshold`, so every connection of the process follows it) turns
that off on every pool and on every connection Deadman opens itself (migrations,
listeners): what PgBouncer in transaction mode before 1.21 needs, where a prepared
statement lives on whichever server connection the transaction happened to get.
With it off, an explicit ``execute(..., prepare=True)`` is not prepared either
(psycopg answers "no" to every request when the threshold is None).
"""

from __future__ import annotations

from typing import Any, TypedDict, Unpack

import psycopg
from psycopg.rows import DictRow, dict_row
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from deadman.config import connection_settings
from deadman.db import jsoncodec

AsyncConn = psycopg.AsyncConnection[DictRow]

#: outlive any database outage: a year
FOREVER_S = 365 * 24 * 3600.0
#: psycopg's own default: prepare a statement on its fifth run on a connection
PREPARE_THRESHOLD = 5


def prepare_threshold(prepare: bool | None = None) -> int | None:
    """psycopg's ``prepare_threshold`` for a new connection: None (never prepare)
    when ``prepare`` is False, or, with ``prepare`` None, when the environment says
    ``DEADMAN_PREPARE=off``."""
    if prepare is None:
        prepare = connection_settings().prepare
    return PREPARE_THRESHOLD if prepare else None


class PoolOptions(TypedDict, total=False):
    """What a caller may set on a pool: its size, the longest wait for a connection
    (``timeout``) and how long a broken connection is replaced (``reconnect_timeout``)."""

    min_size: int
    max_size: int
    timeout: float
    reconnect_timeout: float


#: The defaults: an async pool serves a whole process (the worker's claims and
#: completions, the API's requests); a sync pool serves a client or sync handlers, and
#: waits longer for a connection, as a blocking caller would.
ASYNC_DEFAULTS = PoolOptions(min_size=1, max_size=10, timeout=10.0, reconnect_timeout=FOREVER_S)
SYNC_DEFAULTS = PoolOptions(min_size=1, max_size=4, timeout=30.0, reconnect_timeout=FOREVER_S)


def async_pool(
    dsn: str, *, name: str, prepare: bool | None = None, **options: Unpack[PoolOptions]
) -> AsyncConnectionPool[AsyncConn]:
    """An async pool, not opened yet (``await pool.open()``). ``prepare``: see
    :func:`prepare_threshold`."""
    return AsyncConnectionPool(
        dsn,
        kwargs={
            "autocommit": True,
            "row_factory": dict_row,
            "prepare_threshold": prepare_threshold(prepare),
            "context": jsoncodec.CONTEXT,
        },
        open=False,
        name=name,
        **(ASYNC_DEFAULTS | options),
    )


def sync_pool(
    dsn: str, *, name: str, prepare: bool | None = None, **options: Unpack[PoolOptions]
) -> ConnectionPool[psycopg.Connection[Any]]:
    """A sync pool, opened (connections are made in the background). ``prepare``: see
    :func:`prepare_threshold`."""
    return ConnectionPool(
        dsn,
        kwargs={
            "autocommit": True,
            "prepare_threshold": prepare_threshold(prepare),
            "context": jsoncodec.CONTEXT,
        },
        open=True,
        name=name,
        **(SYNC_DEFAULTS | options),
    )


def ready_sync_pool(pool: ConnectionPool[Any]) -> ConnectionPool[Any]:
    """``pool`` once its first connection is made (at most its ``timeout``; psycopg then
    closes it and raises PoolTimeout). A client's first request would otherwise queue
    while the pool connects, and psycopg_pool answers a queued request by growing the
    pool: a client called from one thread then took turns between two connections,
    which cost 70 us of its CPU and 150 us per enqueue on this machine (DECISIONS 58)."""
    pool.wait(timeout=pool.timeout)
    return pool


async def ready_async_pool(pool: AsyncConnectionPool[AsyncConn]) -> AsyncConnectionPool[AsyncConn]:
    """:func:`ready_sync_pool` for an async pool not opened yet: opened, and its first
    connection made."""
    await pool.open(wait=True, timeout=pool.timeout)
    return pool
