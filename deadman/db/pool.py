"""Every connection pool Deadman opens, made in one place: the worker's, the API's,
the handlers', the Python client's. One set of defaults, so the pools cannot drift
apart in how they connect or how long they keep trying.

Async pools give dict rows (what the store and handlers read); every pool's
connections are in autocommit (a single statement commits in its own round trip;
the multi-statement paths open their own transactions). ``reconnect_timeout``: how
long psycopg_pool keeps trying to replace a broken connection before it gives the
slot up (0 would mean: at the first failure); a worker must outlive any outage.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.rows import DictRow, dict_row
from psycopg_pool import AsyncConnectionPool, ConnectionPool

AsyncConn = psycopg.AsyncConnection[DictRow]

#: outlive any database outage: a year
FOREVER_S = 365 * 24 * 3600.0


def async_pool(
    dsn: str,
    *,
    name: str,
    min_size: int = 1,
    max_size: int = 10,
    timeout: float = 10.0,
    reconnect_timeout: float = FOREVER_S,
) -> AsyncConnectionPool[AsyncConn]:
    """An async pool, not opened yet (``await pool.open()``)."""
    return AsyncConnectionPool(
        dsn,
        min_size=min_size,
        max_size=max_size,
        kwargs={"autocommit": True, "row_factory": dict_row},
        open=False,
        timeout=timeout,
        reconnect_timeout=reconnect_timeout,
        name=name,
    )


def sync_pool(
    dsn: str,
    *,
    name: str,
    min_size: int = 1,
    max_size: int = 4,
    timeout: float = 30.0,
    reconnect_timeout: float = FOREVER_S,
) -> ConnectionPool[psycopg.Connection[Any]]:
    """A sync pool, opened (connections are made in the background)."""
    return ConnectionPool(
        dsn,
        min_size=min_size,
        max_size=max_size,
        kwargs={"autocommit": True},
        open=True,
        timeout=timeout,
        reconnect_timeout=reconnect_timeout,
        name=name,
    )
