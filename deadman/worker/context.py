"""What a handler gets besides the job: identity, cancellation, and the fenced
transaction that makes effects exactly-once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import (
    AbstractAsyncContextManager,
    AbstractContextManager,
    asynccontextmanager,
    contextmanager,
)
from typing import TYPE_CHECKING, Any

from psycopg.pq import TransactionStatus
from psycopg_pool import PoolTimeout

from deadman.errors import DatabaseUnavailable, DeadmanError, LeaseLost
from deadman.model import AttemptOutcome, Job, JobState
from deadman.store import AsyncConn, Finish, SyncConn
from deadman.worker.outcome import checked_result
from deadman.worker.worker_store import WorkerStore

if TYPE_CHECKING:
    from psycopg_pool import AsyncConnectionPool, ConnectionPool

    from deadman.store import SyncStore


class JobContext:
    """Per-attempt context. Thread-safe where a sync handler touches it."""

    def __init__(
        self,
        job: Job,
        *,
        worker_id: str,
        store: WorkerStore,
        pool: AsyncConnectionPool[AsyncConn],
        sync_store: SyncStore,
        sync_pool: Callable[[], ConnectionPool[Any]],
        trusted_until: float,
        max_result_bytes: int = 1024 * 1024,
    ) -> None:
        """``pool`` and ``sync_pool``: the handlers' own connections, never the pool
        the worker's heartbeat, claims and completions use (see process.py); the
        stores only run the fenced completion on the handler's connection."""
        assert job.lease is not None, "a context is only made for a claimed job"
        self.job = job
        self.job_id = job.id
        self.attempt = job.attempt
        self.lease_token = job.lease.token
        self.worker_id = worker_id
        #: Pass this to downstream systems (payment APIs, mail relays) so that they
        #: can drop a repeated request: execution here is at-least-once.
        self.idempotency_key = job.idempotency_key or f"deadman-job-{job.id}"
        self.result: Any = None
        #: how ``result`` becomes JSON when ctx.transaction() stores it: a typed task
        #: sets its return annotation's encoder, so a model may be assigned as it is
        self.encode_result: Callable[[Any], Any] | None = None
        self._max_result_bytes = max_result_bytes
        self._store = store
        self._pool = pool
        self._sync_store = sync_store
        self._sync_pool = sync_pool
        self._lock = threading.Lock()
        #: the worker's event loop's thread: a context is made there (Executor.start)
        self._loop_thread = threading.get_ident()
        self._trusted_until = trusted_until
        # Why the handler should stop (plain flags: set once, read from any thread),
        # and an Event a sync handler can block on until either is set, made only
        # when a handler calls wait_cancelled (at thousands of jobs/s, one Event per
        # job was 8 % of the worker's CPU).
        self._cancel_requested = False
        self._lease_lost = False
        self._stopped: threading.Event | None = None
        #: monotonic time of the handler's last ctx.heartbeat() (the start counts)
        self.last_heartbeat = time.monotonic()
        self._tx_used = False
        self.completed_in_transaction = False
        #: True while the fenced completion inside ctx.transaction() is committing.
        self.finishing = False

    # -- state the worker updates ----------------------------------------------------

    def renew_trust(self, until: float) -> None:
        with self._lock:
            self._trusted_until = max(self._trusted_until, until)

    def trust_expired(self, now: float | None = None) -> bool:
        return (time.monotonic() if now is None else now) >= self._trusted_until

    def mark_lease_lost(self) -> None:
        self._lease_lost = True
        self._wake_waiter()

    def request_cancel(self) -> None:
        self._cancel_requested = True
        self._wake_waiter()

    def _wake_waiter(self) -> None:
        with self._lock:
            if self._stopped is not None:
                self._stopped.set()

    # -- what handlers call and read ---------------------------------------------------

    def heartbeat(self) -> None:
        """Say "still making progress". With the job's ``heartbeat_timeout_ms`` set, a
        handler that goes that long without calling this is treated as hung: its
        attempt ends ``timed_out`` and the job retries by the usual rules. Cheap (no
        database write: the lease is renewed by the worker's own heartbeat)."""
        self.last_heartbeat = time.monotonic()

    def wait_cancelled(self, timeout: float) -> bool:
        """For sync handlers: sleep up to ``timeout`` seconds, waking at once when the
        handler should stop. Returns ``ctx.cancelled``."""
        with self._lock:
            if self._stopped is None:
                self._stopped = threading.Event()
                if self.cancelled:  # set before anyone waited
                    self._stopped.set()
            stopped = self._stopped
        return stopped.wait(timeout)

    @property
    def lease_lost(self) -> bool:
        """True once the worker gave this attempt's lease up (lost, or no renewal
        confirmed in time): stop. The job is handed on; ``ctx.transaction()`` is
        refused once the lease has lapsed."""
        return self._lease_lost

    @property
    def cancel_requested(self) -> bool:
        """True once the worker asked the handler to stop while it holds the lease: a
        cancel, the job's timeout, a missed ``heartbeat_timeout_ms``, or shutdown."""
        return self._cancel_requested

    @property
    def cancelled(self) -> bool:
        """True when the handler should stop: cancel asked for, or the lease is gone."""
        return self._cancel_requested or self._lease_lost

    def _success(self) -> Finish:
        """The completion ctx.transaction() writes. ``ctx.result`` is held to what a
        returned result is (outcome.checked_result: JSON, storable, within
        DEADMAN_MAX_PAYLOAD_BYTES); one that is not raises here, before anything is
        written, and the whole transaction rolls back."""
        value = self.result if self.encode_result is None else self.encode_result(self.result)
        stored, _, problem = checked_result(value, self._max_result_bytes)
        if problem is not None:
            raise DeadmanError(f"ctx.result: {problem}")
        return Finish(
            self.job_id,
            self.lease_token,
            JobState.SUCCEEDED,
            AttemptOutcome.SUCCEEDED,
            result=stored,
        )

    def _claim_tx(self, *, on_loop: bool) -> None:
        """Once per attempt, and in the form that fits the thread: ``on_loop`` says
        whether the form used (``async with``) belongs on the worker's loop."""
        if (threading.get_ident() == self._loop_thread) != on_loop:
            raise DeadmanError(_WRONG_FORM[on_loop])
        if self._tx_used:
            raise DeadmanError("ctx.transaction() can be used once per attempt")
        self._tx_used = True

    @contextmanager
    def _finishing(self) -> Iterator[None]:
        """Around the fenced completion: ``finishing`` is True while it commits (the
        worker then leaves the lease alone), and False again if it raised."""
        self.finishing = True
        try:
            yield
        except BaseException:
            self.finishing = False
            raise

    def _still_open(self, conn: AsyncConn | SyncConn) -> None:
        """The block left its transaction open and usable, or the attempt fails, saying
        why (its retry runs the block again):
        - idle: a COMMIT or ROLLBACK statement ended it behind psycopg's back, and a
          completion written now would commit on its own, without the effect (or
          after it, not with it);
        - aborted: a statement failed and the handler caught the error, so nothing
          more can run in it (psycopg's own words for that name no cause)."""
        status = conn.info.transaction_status
        if status is TransactionStatus.IDLE:
            raise DeadmanError(
                f"job {self.job_id}: the transaction was ended inside ctx.transaction()"
                " (a COMMIT or ROLLBACK statement), so the completion cannot join it:"
                " this attempt fails; what the block had committed stays committed"
            )
        if status is TransactionStatus.INERROR:
            raise DeadmanError(
                f"job {self.job_id}: a statement in ctx.transaction() failed and its error"
                " was caught, which leaves the transaction aborted: the effect and the"
                " completion roll back and this attempt fails. To recover from a"
                " statement's error inside the block, run it in a nested"
                " conn.transaction() (a savepoint)"
            )

    def _fence(self, written: bool) -> None:
        """The completion was refused (the lease is gone): LeaseLost, and the whole
        transaction rolls back."""
        if not written:
            self.mark_lease_lost()
            raise LeaseLost(f"job {self.job_id}: lease {self.lease_token} is gone")

    def transaction(self) -> FencedTransaction:
        """A database transaction whose commit also completes the job, fenced.

        Use ``async with`` in async handlers and ``with`` in sync ones. On a clean
        exit the job is marked succeeded in the same transaction, guarded by this
        attempt's lease token; if the lease was lost meanwhile, :class:`LeaseLost`
        is raised and the whole transaction (your effect included) rolls back.
        Set ``ctx.result`` inside the block to store a result.

        Raising ``psycopg.Rollback`` in the block rolls it back, effect and completion
        alike, and the handler goes on: what it then returns completes the job as a
        returned result does (at-least-once). End the transaction only that way: a
        COMMIT or ROLLBACK statement run in the block fails the attempt, since the
        completion can no longer join the effect.

        The connection comes from the worker's handler pool (at most
        ``min(concurrency, 16)`` connections, or ``DEADMAN_HANDLER_POOL_SIZE``): when
        all are in use the handler waits for one, and after 30 s
        (``HANDLER_POOL_TIMEOUT_S``) gets :class:`DatabaseUnavailable`, which fails the
        attempt (retried by the job's backoff) like any error.

        The database, not this process's clock, decides: the write is attempted even
        when this worker suspects its lease has lapsed, and refused if it has.
        """
        return FencedTransaction(self)

    @asynccontextmanager
    async def _async_tx(self) -> AsyncIterator[AsyncConn]:
        self._claim_tx(on_loop=True)
        written = False
        async with _async_conn(self._pool) as conn, conn.transaction():
            yield conn
            self._still_open(conn)
            with self._finishing():
                written = await self._store.job_succeed_in(conn, self._success())
            self._fence(written)
        # Not reached after an error; after psycopg.Rollback (which conn.transaction()
        # swallows) it is, with nothing written: the handler goes on, not completed.
        self.completed_in_transaction = written

    @contextmanager
    def _sync_tx(self) -> Iterator[SyncConn]:
        self._claim_tx(on_loop=False)
        written = False
        with _sync_conn(self._sync_pool()) as conn, conn.transaction():
            yield conn
            self._still_open(conn)
            with self._finishing():
                written = self._sync_store.job_succeed_in(conn, self._success())
            self._fence(written)
        self.completed_in_transaction = written  # see _async_tx


#: ctx.transaction() in the form that does not fit the thread, by the form used
_WRONG_FORM = {
    False: "ctx.transaction(): `with` (the sync form) in an async handler would block"
    " the worker's event loop, and with it every other job's heartbeat: use"
    " `async with ctx.transaction()`",
    True: "ctx.transaction(): `async with` outside the worker's event loop (a sync"
    " handler's own asyncio.run?): its connections belong to that loop; use"
    " `with ctx.transaction()` in a sync handler",
}


def _no_connection(pool_name: str, max_size: int, timeout: float) -> DatabaseUnavailable:
    return DatabaseUnavailable(
        f"ctx.transaction(): no database connection free within {timeout:g} s: all"
        f" {max_size} of the worker's handler connections ({pool_name}) are in use;"
        " this attempt fails and the job is retried"
    )


@asynccontextmanager
async def _async_conn(pool: AsyncConnectionPool[AsyncConn]) -> AsyncIterator[AsyncConn]:
    """pool.connection(), with a pool timeout turned into a clear, retryable error
    (and only the wait for a connection: an error inside the block stays as it is)."""
    try:
        conn = await pool.getconn()
    except PoolTimeout as exc:
        raise _no_connection(pool.name, pool.max_size, pool.timeout) from exc
    try:
        yield conn
    finally:
        await pool.putconn(conn)  # rolls back or discards a connection left unusable


@contextmanager
def _sync_conn(pool: ConnectionPool[Any]) -> Iterator[SyncConn]:
    """See _async_conn."""
    try:
        conn = pool.getconn()
    except PoolTimeout as exc:
        raise _no_connection(pool.name, pool.max_size, pool.timeout) from exc
    try:
        yield conn
    finally:
        pool.putconn(conn)


class FencedTransaction:
    """``async with ctx.transaction() as conn`` or ``with ctx.transaction() as conn``."""

    def __init__(self, ctx: JobContext) -> None:
        self._ctx = ctx
        self._acm: AbstractAsyncContextManager[AsyncConn] | None = None
        self._cm: AbstractContextManager[SyncConn] | None = None

    async def __aenter__(self) -> AsyncConn:
        self._acm = self._ctx._async_tx()
        return await self._acm.__aenter__()

    async def __aexit__(self, et: Any, ev: Any, tb: Any) -> bool | None:
        assert self._acm is not None
        return await self._acm.__aexit__(et, ev, tb)

    def __enter__(self) -> SyncConn:
        self._cm = self._ctx._sync_tx()
        return self._cm.__enter__()

    def __exit__(self, et: Any, ev: Any, tb: Any) -> bool | None:
        assert self._cm is not None
        return self._cm.__exit__(et, ev, tb)
