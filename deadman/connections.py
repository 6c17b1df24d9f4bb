"""What ``conn=`` accepts, and the psycopg connection underneath it: the one place
that knows SQLAlchemy's and Django's connection objects.

A job given ``conn=`` is written on the caller's psycopg connection, inside whatever
transaction (and savepoint) it is in, so it commits with the caller's work or not at
all. Accepted:

- a psycopg ``Connection`` (``Client``) or ``AsyncConnection`` (``AsyncClient``), as is;
- SQLAlchemy 2.x on the psycopg driver (``postgresql+psycopg://``): a ``Connection`` or
  ``Session`` (``Client``), an ``AsyncConnection`` or ``AsyncSession``
  (``AsyncClient``). Their transaction is begun if it was not yet, as their own
  ``execute`` would (autobegin): without it their ``commit()`` would have nothing to
  commit, and the job would be rolled back when the connection goes back to the pool;
- a Django connection (``django.db.connection``, ``connections[alias]``) inside
  ``transaction.atomic()`` with the psycopg 3 backend (:mod:`deadman.contrib.django`).

Anything else raises :class:`~deadman.errors.UnsupportedConnection`, naming what it got.
So does a connection to another database than the client's own: the first time the
client sees a physical connection it compares ``current_database()`` and the
server's start time (``pg_postmaster_start_time()``) on both sides (query
``server_identity``, readable by any role; the cluster's ``system_identifier`` is
not, where ``pg_control_system()`` is revoked). Both are read afresh for each check,
so a restarted server is no false alarm.
"""

from __future__ import annotations

import sys
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias, TypeVar

import psycopg

from deadman.errors import UnsupportedConnection

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection as SAConnection
    from sqlalchemy.engine import Dialect
    from sqlalchemy.ext.asyncio import AsyncConnection as SAAsyncConnection
    from sqlalchemy.ext.asyncio import AsyncSession
    from sqlalchemy.orm import Session


class DjangoConnection(Protocol):
    """What deadman reads of a Django database connection (``django.db.connection``)."""

    vendor: str
    in_atomic_block: bool
    connection: Any

    def ensure_connection(self) -> None: ...

    def validate_no_broken_transaction(self) -> None: ...


SyncJoinable: TypeAlias = "psycopg.Connection[Any] | SAConnection | Session | DjangoConnection"
AsyncJoinable: TypeAlias = "psycopg.AsyncConnection[Any] | SAAsyncConnection | AsyncSession"
#: what ``conn=`` takes: a sync one for Client, an async one for AsyncClient
Joinable: TypeAlias = "SyncJoinable | AsyncJoinable"
#: (database, server start): server_identity's row
Identity = tuple[str, datetime]
C = TypeVar("C")


def sync_connection(conn: Joinable) -> psycopg.Connection[Any]:
    """The psycopg connection (of the current transaction) behind ``conn``."""
    if isinstance(conn, psycopg.Connection):
        return conn
    if _is_django(conn):
        from deadman.contrib.django import psycopg_connection

        return psycopg_connection(conn)  # type: ignore[arg-type]
    sa = _sqlalchemy()
    if sa is not None:
        from sqlalchemy.engine import Connection
        from sqlalchemy.orm import Session

        if isinstance(conn, Session):
            conn = conn.connection()  # the session's transaction's connection
        if isinstance(conn, Connection):
            _psycopg_dialect(conn.dialect)
            if not conn.in_transaction():
                conn.begin()
            return _driver(conn.connection.driver_connection, psycopg.Connection)
    raise _unsupported(conn, "Client")


async def async_connection(conn: Joinable) -> psycopg.AsyncConnection[Any]:
    """The psycopg async connection (of the current transaction) behind ``conn``."""
    if isinstance(conn, psycopg.AsyncConnection):
        return conn
    sa = _sqlalchemy()
    if sa is not None:
        from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

        if isinstance(conn, AsyncSession):
            conn = await conn.connection()
        if isinstance(conn, AsyncConnection):
            _psycopg_dialect(conn.dialect)
            if not conn.in_transaction():
                await conn.begin()
            raw = await conn.get_raw_connection()
            return _driver(raw.driver_connection, psycopg.AsyncConnection)
    raise _unsupported(conn, "AsyncClient")


def check_same_database(theirs: Identity, ours: Identity, dsn: str) -> None:
    """Refuse a connection that reaches another database (or server) than ``dsn``."""
    if theirs != ours:
        raise UnsupportedConnection(
            f"conn= is connected to database {theirs[0]!r} (server started {theirs[1]}), "
            f"not to the client's own {ours[0]!r} (server started {ours[1]}, dsn "
            f"{_redacted(dsn)!r}): a job written there would never reach the workers"
        )


def _sqlalchemy() -> Any:
    """SQLAlchemy, if the application imported it (its objects exist only then)."""
    return sys.modules.get("sqlalchemy")


def _is_django(conn: object) -> bool:
    return all(hasattr(conn, a) for a in ("in_atomic_block", "ensure_connection", "vendor"))


def _psycopg_dialect(dialect: Dialect) -> None:
    if dialect.name != "postgresql" or dialect.driver != "psycopg":
        raise UnsupportedConnection(
            f"conn= is a SQLAlchemy connection on {dialect.name}+{dialect.driver}; deadman "
            "joins only psycopg 3 connections: create the engine with postgresql+psycopg://"
        )


def _driver(raw: object, kind: type[C]) -> C:
    """SQLAlchemy's driver connection, which must be psycopg's (checked by the dialect)."""
    if not isinstance(raw, kind):
        raise _unsupported(raw, "this client")
    return raw


def _unsupported(conn: object, client: str) -> UnsupportedConnection:
    got = f"{type(conn).__module__}.{type(conn).__qualname__}"
    hint = ""
    if isinstance(conn, psycopg.AsyncConnection):
        hint = "; an async connection goes to deadman.AsyncClient"
    elif isinstance(conn, psycopg.Connection) or _is_django(conn):
        hint = "; a sync connection goes to deadman.Client"
    elif type(conn).__module__.split(".")[0] in {"psycopg2", "asyncpg", "pg8000"}:
        hint = "; deadman joins only psycopg 3 connections"
    return UnsupportedConnection(
        f"{client} cannot join a {got}{hint} (conn= takes a psycopg connection, a "
        "SQLAlchemy Connection/Session on postgresql+psycopg://, or a Django connection "
        "inside transaction.atomic(); see deadman.connections)"
    )


def _redacted(dsn: str) -> str:
    """The dsn without its password, for an error message."""
    try:
        from psycopg.conninfo import conninfo_to_dict, make_conninfo

        parts = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return "<unparsable dsn>"
    parts.pop("password", None)
    return make_conninfo(**{k: str(v) for k, v in parts.items() if v is not None})
