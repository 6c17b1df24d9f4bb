"""Waiting for the database when a process starts.

A worker, rescuer, API server or ``deadman migrate`` started while Postgres is down,
restarting, or still in crash recovery used to die at its first connection: under
systemd or a compose restart policy that is a crash loop through every outage, and
systemd's start limit then leaves the unit failed for good. Instead, a starting
process tries, waits with capped exponential backoff and jitter, and logs one
``database_waiting`` line per failed try (what it waits for, where, why, when it
tries again), up to ``DEADMAN_STARTUP_WAIT_S`` (unset: no limit).

What is worth waiting for and what is not:

- **wait**: no answer, connection refused, a host name that does not resolve yet (a
  compose service not up), "the database system is starting up", "... is shutting
  down", "... in recovery", too many clients; and, when the caller needs the schema,
  a database without it or at an older version (a one-shot ``deadman migrate`` may be
  running right now).
- **fail at once**: wrong password, unknown role, unknown database, no pg_hba entry,
  a role that may not log in, an invalid connection string, a schema newer than this
  code. Waiting cannot fix those; a clear error and exit code 2 can.

libpq reports start-up failures as text, without an SQLSTATE, so the permanent
ones are recognised by the server's (English) messages. Anything not recognised is
taken as transient: waiting with a log line that quotes the message is the safer
mistake than exiting on an outage.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import re
import signal
import time
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from deadman import logs
from deadman.db.migrate import latest_version
from deadman.db.queries import QUERIES
from deadman.errors import ConfigError, DatabaseUnavailable, SchemaMismatch

log = logs.get("deadman.startup")

#: Backoff: the first retry after about BASE_S, doubling up to CAP_S; each delay is
#: drawn from [delay/2, delay] so a fleet restarted together does not retry together.
BASE_S = 0.5
CAP_S = 10.0
#: One connection attempt's limit; a black-holed address must not stall a try forever.
CONNECT_TIMEOUT_S = 5

#: Server and libpq messages that waiting cannot fix.
_PERMANENT = re.compile(
    "|".join(
        (
            r"password authentication failed",
            r"authentication failed for user",
            r"role \".*\" does not exist",
            r"database \".*\" does not exist",
            r"no pg_hba\.conf entry",
            r"pg_hba\.conf rejects connection",
            r"is not permitted to log in",
            r"permission denied for database",
            r"no password supplied",
            r"server does not support SSL, but SSL was required",
            r"invalid (?:integer value|port number|connection option|sslmode value)",
        )
    ),
    re.IGNORECASE,
)


@dataclass(frozen=True)
class StartupWait:
    """What a starting process waits for.

    ``process`` names it in the log; ``limit_s`` is how long it waits in all (None:
    no limit; 0: one try); ``schema``: also wait until the database's schema is at
    this code's version (a worker needs it; ``migrate`` is what provides it).
    """

    process: str
    limit_s: float | None
    schema: bool = True


class _NotYet(Exception):
    """A try failed in a way worth waiting out; the message says why."""

    def __init__(self, reason: str, waiting_for: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.waiting_for = waiting_for


def redact(dsn: str) -> str:
    """The DSN as ``key=value`` pairs without its password: safe for logs and errors."""
    try:
        params = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return "<invalid connection string>"
    for secret in ("password", "sslpassword"):
        params.pop(secret, None)
    return make_conninfo("", **params)


def one_line(exc: BaseException) -> str:
    """psycopg's connection errors span lines (libpq's hints); logs want one."""
    text = " ".join(str(exc).split())
    return text.removeprefix("connection failed: ") or type(exc).__name__


def backoff_s(attempt: int) -> float:
    """The pause after failed try number ``attempt`` (1-based), jitter included."""
    delay = min(CAP_S, BASE_S * 2.0 ** min(attempt - 1, 32))
    return random.uniform(delay / 2, delay)


def is_permanent(message: str) -> bool:
    return bool(_PERMANENT.search(message))


async def wait_for_database(dsn: str, wait: StartupWait) -> bool:
    """Return True once the database takes connections (and, with ``wait.schema``,
    has this code's schema); False if SIGTERM or SIGINT arrived first (the caller
    exits 0: nothing was started).

    Raises :class:`ConfigError` or :class:`SchemaMismatch` at once for what waiting
    cannot fix, and :class:`DatabaseUnavailable` once ``wait.limit_s`` has passed.
    While it waits, SIGTERM/SIGINT are its own; it gives them back before returning.
    """
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    where = redact(dsn)
    started = time.monotonic()
    with _signals_set(loop, stop):
        attempt = 0
        while True:
            attempt += 1
            try:
                await _until_stopped(_try_once(dsn, wait.schema), stop)
            except _Stopped:
                log.info("startup_wait_stopped", process=wait.process, attempts=attempt)
                return False
            except _NotYet as not_yet:
                waited = time.monotonic() - started
                pause = backoff_s(attempt)
                if wait.limit_s is not None:
                    # the last try falls on the limit, not a backoff step before it
                    pause = min(pause, wait.limit_s - waited)
                if pause <= 0:
                    raise DatabaseUnavailable(
                        f"{wait.process}: gave up waiting for the database ({where}) after "
                        f"{waited:.1f} s and {attempt} tries (DEADMAN_STARTUP_WAIT_S="
                        f"{wait.limit_s:g}): {not_yet.reason}"
                    ) from None
                log.warning(
                    "database_waiting",
                    process=wait.process,
                    waiting_for=not_yet.waiting_for,
                    dsn=where,
                    reason=not_yet.reason,
                    attempt=attempt,
                    retry_in_s=round(pause, 2),
                    waited_s=round(waited, 1),
                    limit_s=wait.limit_s,
                )
                try:
                    await _until_stopped(asyncio.sleep(pause), stop)
                except _Stopped:
                    log.info("startup_wait_stopped", process=wait.process, attempts=attempt)
                    return False
                continue
            if attempt > 1:
                log.info(
                    "database_ready",
                    process=wait.process,
                    dsn=where,
                    attempts=attempt,
                    waited_s=round(time.monotonic() - started, 1),
                )
            return True


async def check_once(dsn: str, *, schema: bool) -> str | None:
    """One try: None when the database is ready, else why not (worth waiting for).
    Raises what :func:`wait_for_database` raises at once."""
    try:
        await _try_once(dsn, schema)
    except _NotYet as not_yet:
        return not_yet.reason
    return None


async def require_ready(dsn: str) -> None:
    """For commands that do not wait (``deadman jobs ...``): one try, and a clear
    error at once: :class:`DatabaseUnavailable` (exit 3) when it cannot connect,
    :class:`SchemaMismatch` (exit 2) when the schema is missing or old."""
    try:
        await _try_once(dsn, True)
    except _NotYet as not_yet:
        if not_yet.waiting_for == "schema":
            raise SchemaMismatch(not_yet.reason) from None
        raise DatabaseUnavailable(
            f"the database is unavailable ({redact(dsn)}): {not_yet.reason}"
        ) from None


async def _try_once(dsn: str, schema: bool) -> None:
    try:
        conn = await psycopg.AsyncConnection.connect(
            dsn, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S
        )
    except psycopg.ProgrammingError as exc:  # the connection string does not parse
        raise ConfigError(f"DEADMAN_DATABASE_URL (or --database-url) is invalid: {exc}") from None
    except psycopg.OperationalError as exc:
        reason = one_line(exc)
        if is_permanent(reason):
            raise ConfigError(f"cannot use the database ({redact(dsn)}): {reason}") from None
        raise _NotYet(reason, "connection") from None
    try:
        async with conn:
            if schema:
                await _check_schema(conn)
    except psycopg.OperationalError as exc:  # lost again between connect and query
        raise _NotYet(one_line(exc), "connection") from None
    except psycopg.errors.InsufficientPrivilege as exc:
        raise ConfigError(f"cannot read the schema version ({redact(dsn)}): {exc}") from None


async def _check_schema(conn: psycopg.AsyncConnection[tuple[object, ...]]) -> None:
    want = latest_version()
    cur = await conn.execute(QUERIES["schema_migrations_exists"])
    present = await cur.fetchone()
    have: int | None = None
    if present and present[0]:
        cur = await conn.execute(QUERIES["schema_version_get"])
        row = await cur.fetchone()
        have = None if row is None or row[0] is None else int(str(row[0]))
    if have is None:
        raise _NotYet("the database has no Deadman schema yet; run `deadman migrate`", "schema")
    if have < want:
        raise _NotYet(
            f"the schema is at version {have}, this code needs {want}; run `deadman migrate`",
            "schema",
        )
    if have > want:
        raise SchemaMismatch(
            f"the database schema is at version {have}, newer than this code ({want}); "
            "upgrade Deadman"
        )


class _Stopped(Exception):
    """SIGTERM or SIGINT arrived while waiting."""


async def _until_stopped(work: Coroutine[Any, Any, object], stop: asyncio.Event) -> None:
    """Run ``work`` unless ``stop`` is set first (then cancel it and raise _Stopped)."""
    task = asyncio.ensure_future(work)
    stopper = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopper.cancel()
    if task.done():
        task.result()
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task
    raise _Stopped


@contextlib.contextmanager
def _signals_set(loop: asyncio.AbstractEventLoop, stop: asyncio.Event) -> Iterator[None]:
    sigs = (signal.SIGTERM, signal.SIGINT)
    for sig in sigs:
        loop.add_signal_handler(sig, stop.set)
    try:
        yield
    finally:
        for sig in sigs:
            loop.remove_signal_handler(sig)
