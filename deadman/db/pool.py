"""Every connection pool Deadman opens, made in one place: the worker's, the API's,
the handlers', the Python client's. One set of options with one table of defaults, so
the pools cannot drift apart in how they connect or how long they keep trying.

Async pools give dict rows (what the store and handlers read); every pool's
connections are in autocommit (a single statement commits in its own round trip;
the multi-statement paths open their own transactions). ``reconnect_timeout``: how
long psycopg_pool keeps trying to replace a broken connection before it gives the
slot up (0 would mean: at the first failure); a worker must outlive any outage.
"""

from __future__ import annotations

from typing import Any, TypedDict, Unpack

import psycopg
from psycopg.rows import DictRow, dict_row
from psycopg_pool import AsyncConnectionPool, ConnectionPool

AsyncConn = psycopg.AsyncConnection[DictRow]

#: outlive any database outage: a year
FOREVER_S = 365 * 24 * 3600.0


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
    dsn: str, *, name: str, **options: Unpack[PoolOptions]
) -> AsyncConnectionPool[AsyncConn]:
    """An async pool, not opened yet (``await pool.open()``)."""
    return AsyncConnectionPool(
        dsn,
        kwargs={"autocommit": True, "row_factory": dict_row},
        open=False,
        name=name,
        **(ASYNC_DEFAULTS | options),
    )


def sync_pool(
    dsn: str, *, name: str, **options: Unpack[PoolOptions]
) -> ConnectionPool[psycopg.Connection[Any]]:
    """A sync pool, opened (connections are made in the background)."""
    return ConnectionPool(
        dsn,
        kwargs={"autocommit": True},
        open=True,
        name=name,
        **(SYNC_DEFAULTS | options),
    )
