"""The order service's SQL: its schema (schema.sql, applied by :func:`migrate`) and
its named queries (queries.sql, split by deadman's own loader)."""

from __future__ import annotations

from importlib import resources
from typing import Any, LiteralString

from psycopg import AsyncConnection
from psycopg.rows import DictRow, dict_row
from psycopg_pool import AsyncConnectionPool

from deadman.db.queries import parse

Conn = AsyncConnection[DictRow]


def _read(name: str) -> str:
    return resources.files(__package__).joinpath(name).read_text(encoding="utf-8")


QUERIES: dict[str, LiteralString] = parse(_read("queries.sql"))


def pool(dsn: str) -> AsyncConnectionPool[Conn]:
    """The app's pool, not opened yet. Autocommit: every transaction is an explicit
    ``async with conn.transaction()``, never one left open by a forgotten commit."""
    return AsyncConnectionPool(
        dsn,
        connection_class=AsyncConnection[DictRow],
        kwargs={"autocommit": True, "row_factory": dict_row},
        min_size=1,
        max_size=8,
        open=False,
        name="orders",
    )


async def migrate(conn: Conn) -> None:
    """Create the shop schema if it is not there (schema.sql, in one transaction)."""
    async with conn.transaction():
        await conn.execute(_read("schema.sql").encode())


async def fetch_one(conn: Conn, query: str, params: dict[str, Any]) -> DictRow | None:
    """Run the named ``query`` and return its first row (None: no row)."""
    cur = await conn.execute(QUERIES[query], params)
    return await cur.fetchone()


async def fetch_row(conn: Conn, query: str, params: dict[str, Any]) -> DictRow:
    """:func:`fetch_one` for a query that always returns a row (an INSERT ... RETURNING)."""
    row = await fetch_one(conn, query, params)
    assert row is not None, f"{query} returned no row"
    return row
