"""Test databases copied from the migrated template ahead of the tests that take them,
and made fresh again or dropped after them, by one thread per pytest process.

A copy costs ~90 ms of the server's time and a drop ~8 ms on the test cluster, paid by
~1,000 tests; made here, that work overlaps the tests themselves, which mostly wait on
Postgres or on processes they spawned. A database given back is reset in place when
tests/helpers/database_reset.py can prove that is as good as a new copy (DECISIONS
98), and dropped otherwise.

The thread keeps one connection and gets a new one after Postgres restarts (some tests
restart the session's cluster). A statement that keeps failing for ``give_up_after``
seconds stops the pool, and ``take`` raises what it last saw.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from tests.helpers import database_reset

#: connections to the server fail while a test restarts it; retried this often
_RETRY_PAUSE = 0.2


def unique_name(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:12]}"


def create_statement(name: str, template: str) -> sql.Composed:
    return sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
        sql.Identifier(name), sql.Identifier(template)
    )


def drop_statement(name: str) -> sql.Composed:
    # FORCE: a test that leaked a connection must not leak its database too.
    return sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))


_Statement = Callable[["psycopg.Connection[tuple[object, ...]]"], object]


def _drop(name: str) -> _Statement:
    return lambda conn: conn.execute(drop_statement(name))


class PoolStopped(RuntimeError):
    """The pool's thread gave up (or the pool was closed); the cause is chained."""


class DatabasePool:
    def __init__(
        self,
        server_dsn: str,
        template: str,
        *,
        ahead: int = 2,
        give_up_after: float = 120.0,
        prefix: str = "test",
        reuse: bool = True,
    ) -> None:
        self._server_dsn = server_dsn
        self._prefix = prefix
        self._template = template
        self._ahead = ahead
        self._give_up_after = give_up_after
        self._cond = threading.Condition()
        self._ready: list[str] = []
        self._to_drop: list[str] = []
        self._given_back: list[str] = []
        self._reuse = reuse
        self._baseline: database_reset.Baseline | None = None
        #: the names databases given back were handed out again under, and how many
        #: given back were dropped instead
        self.reused: list[str] = []
        self.dropped = 0
        self._closed = False
        self._draining = False
        self._error: BaseException | None = None
        self._conn: psycopg.Connection[tuple[object, ...]] | None = None
        self._thread = threading.Thread(target=self._run, name="test-database-pool", daemon=True)
        self._thread.start()

    def take(self, timeout: float = 120.0) -> str:
        """The name of a fresh copy of the template, this caller's alone."""
        with self._cond:
            if not self._cond.wait_for(
                lambda: bool(self._ready) or self._error is not None or self._closed, timeout
            ):
                raise PoolStopped(f"no test database made within {timeout:.0f} s")
            if self._ready:
                self._cond.notify_all()  # the thread, waiting while enough were ready
                return self._ready.pop(0)
            raise PoolStopped("the test database pool stopped") from self._error

    def give_back(self, name: str) -> None:
        """Reset ``name`` or drop it, soon; its connections are cut then."""
        with self._cond:
            self._given_back.append(name)
            self._cond.notify_all()

    def close(self) -> None:
        """Stop the thread, which first drops every database it made or was given back;
        PoolStopped if some could not be dropped."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join()
        if self._conn is not None:
            self._conn.close()
        left = self._ready + self._to_drop
        if left:
            raise PoolStopped(f"test databases not dropped: {left}") from self._error

    def _run(self) -> None:
        try:
            while self._work_one():
                pass
        except BaseException as exc:  # anything at all: take() must not wait on a dead thread
            self._stopped_by(exc)
        with self._cond:
            self._cond.wait_for(lambda: self._closed)
        try:
            self._drain()
        except BaseException as exc:
            self._stopped_by(exc)

    def _stopped_by(self, exc: BaseException) -> None:
        with self._cond:
            self._error = exc
            self._cond.notify_all()

    def _drain(self) -> None:
        """After close(): drop what is ready and what was given back."""
        self._draining = True
        while True:
            with self._cond:
                pending = self._ready or self._to_drop or self._given_back
                if not pending:
                    return
                name = pending[0]
            self._retrying(_drop(name))
            with self._cond:
                pending.remove(name)

    def _work_one(self) -> bool:
        with self._cond:
            self._cond.wait_for(
                lambda: (
                    self._closed
                    or bool(self._given_back or self._to_drop)
                    or len(self._ready) < self._ahead
                )
            )
            if self._closed:
                return False
            given_back = self._given_back.pop(0) if self._given_back else None
        if given_back is not None:
            self._reuse_or_drop(given_back)
            return True
        with self._cond:
            # Drops first: they keep the server's count of databases bounded.
            dropping = self._to_drop[0] if self._to_drop else None
        if dropping is not None:
            self._retrying(_drop(dropping))
            with self._cond:
                self._to_drop.remove(dropping)
            return True
        # A new name for every try: a try whose reply was lost may have made its
        # database after all (a restart at its commit), and is dropped, never leaked.
        tried: list[str] = []

        def create(conn: psycopg.Connection[tuple[object, ...]]) -> None:
            tried.append(unique_name(self._prefix))
            conn.execute(create_statement(tried[-1], self._template))

        try:
            self._retrying(create)
        except BaseException:
            with self._cond:
                self._to_drop.extend(tried)
            raise
        made = tried.pop()
        if self._reuse and self._baseline is None:
            self._read_baseline(made)
        with self._cond:
            self._ready.append(made)
            self._to_drop.extend(tried)
            self._cond.notify_all()
        return True

    def _read_baseline(self, fresh: str) -> None:
        """What a fresh copy holds, read from ``fresh`` before anyone has it; tried
        again at the next copy if the server is away. Where no reset can work, every
        database given back is dropped."""
        try:
            self._baseline = database_reset.Baseline.read(
                make_conninfo(self._server_dsn, dbname=fresh)
            )
        except database_reset.NotReusable:
            with self._cond:
                self._reuse = False
        except psycopg.Error:
            self._baseline = None

    def _reuse_or_drop(self, name: str) -> None:
        """Hand ``name`` out again, fresh and under a new name, or drop it."""
        new_name = unique_name(self._prefix)
        try:
            if not self._reuse or self._baseline is None:
                raise database_reset.NotReusable("no reuse, or no fresh copy read yet")
            if self._conn is None or self._conn.closed:
                self._conn = psycopg.connect(self._server_dsn, autocommit=True)
            database_reset.reuse(
                self._conn, self._server_dsn, self._baseline, self._template, name, new_name
            )
        except (database_reset.NotReusable, psycopg.Error):
            for gone in (name, new_name):
                self._retrying(_drop(gone))
            with self._cond:
                self.dropped += 1
            return
        with self._cond:
            self.reused.append(new_name)
            self._ready.append(new_name)
            self._cond.notify_all()

    def _retrying(self, statement: _Statement) -> None:
        """Run ``statement``, on a new connection after a failure, until it works or
        ``give_up_after`` passes; on the pool's thread only."""
        deadline = time.monotonic() + self._give_up_after
        while True:
            try:
                if self._conn is None or self._conn.closed:
                    self._conn = psycopg.connect(self._server_dsn, autocommit=True)
                statement(self._conn)
                return
            except psycopg.Error:
                if self._conn is not None:
                    self._conn.close()
                    self._conn = None
                if time.monotonic() >= deadline:
                    raise
            with self._cond:
                # A pause between tries, which close() cuts short (but not its drain's).
                if self._cond.wait_for(lambda: self._closed and not self._draining, _RETRY_PAUSE):
                    raise PoolStopped("closed while retrying")
