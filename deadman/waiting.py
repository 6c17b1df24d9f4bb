"""Waiting for a job to end: :class:`AsyncWaiter` and :class:`Waiter` (sync).

``wait(job_id, timeout)`` returns the job (state, result, last_error) as soon as it is
succeeded, dead or cancelled, and raises :class:`WaitTimeout` otherwise; an unknown id
raises :class:`~deadman.errors.NotFound` at once.

How a wait is woken (DECISIONS 40): each waiter holds one LISTEN connection on
``deadman_done``, opened at its first wait and shared by every wait it runs. A wait
first makes sure that connection listens, then flags its job (``job_wait_flag``:
``waited = true``, the row read back as it stands): a job that already ended is
answered at once, and whatever ends it later notifies (the ``jobs_notify_done``
trigger, migration 0013). Jobs nobody waits on are never notified about.

Notifications only say "look": the checker reads the notified jobs (one statement for
all of them) and answers the waits whose job really ended; a forged or stale one costs
a read. Polling is the fallback: every ``poll_s`` the checker reads every job still
waited on, and at once after the listener lost its connection and again once it
listens anew, so a notification sent while it was deaf never leaves a wait hanging
until its timeout.

The flag and the reads go through a pool (the API passes its own: a long-poll holds
no connection while it waits); only the listener's connection is held.

Behind PgBouncer in transaction mode (which cannot carry a LISTEN) the listener
connects to ``DEADMAN_LISTEN_URL``, straight to Postgres, when it is set; with
``DEADMAN_LISTEN=off`` there is no listener and a wait is answered by the polls
alone: up to ``poll_s`` (1 s) after its job ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import threading
from collections.abc import Iterable

import psycopg
from psycopg_pool import AsyncConnectionPool

from deadman import logs
from deadman.config import Settings, connection_settings
from deadman.db.pool import async_pool, prepare_threshold
from deadman.db.queries import QUERIES
from deadman.errors import DeadmanError, NotFound
from deadman.model import Job, JobState
from deadman.store import AsyncConn, AsyncStore
from deadman.worker.listener import parse_job_id

__all__ = ["POLL_S", "AsyncWaiter", "WaitStore", "WaitTimeout", "Waiter", "WaiterClosed"]

log = logs.get("deadman.waiting")

#: how often every unanswered wait is checked, whatever the notifications say
POLL_S = 1.0
#: how long a wait waits for the listener before it flags its job anyway (a listener
#: that cannot connect leaves the wait to the polls, it does not fail it)
LISTEN_WAIT_S = 2.0
#: what the listener's connection calls itself (pg_stat_activity.application_name)
APPLICATION_NAME = "deadman-waiter"


class WaitTimeout(DeadmanError):
    """The job did not end within the timeout. ``state``: the state it was last seen in."""

    def __init__(self, job_id: int, timeout: float, state: JobState) -> None:
        self.job_id = job_id
        self.timeout = timeout
        self.state = state
        super().__init__(f"job {job_id} did not end within {timeout:g} s (it is {state.value})")


class WaiterClosed(DeadmanError):
    """The waiter was closed (a server shutting down): the wait ends unanswered."""


class WaitStore(AsyncStore):
    """The store's reads, and the flag a wait sets on its job."""

    async def job_wait_flag(self, job_id: int) -> Job | None:
        """Mark the job as waited on and return it as it stands; None: no such job.
        The caller listens on deadman_done already. A job flagged before (no row
        written) is read in a new snapshot, after its flag committed."""
        rows = await self._all("job_wait_flag", {"id": job_id})
        return Job.from_row(rows[0]) if rows else await self.job_get(job_id)


def _seconds(timeout: float) -> float:
    if isinstance(timeout, bool) or not isinstance(timeout, int | float):
        raise TypeError(f"timeout must be a number of seconds, not {type(timeout).__name__}")
    if not math.isfinite(timeout) or timeout < 0:
        raise ValueError(f"timeout must be a finite number of seconds, at least 0: {timeout!r}")
    return float(timeout)


class AsyncWaiter:
    """Waits for jobs to end, on one event loop. ``pool``: run the flag and the reads on
    it (the API's); by default the waiter opens a small one of its own. ``settings``:
    whether and where to listen, and whether to prepare (``listen``, ``listen_url``,
    ``prepare``; by default the environment's, deadman.config.connection_settings)."""

    def __init__(
        self,
        dsn: str,
        *,
        poll_s: float = POLL_S,
        pool: AsyncConnectionPool[AsyncConn] | None = None,
        settings: Settings | None = None,
    ) -> None:
        conn_settings = connection_settings() if settings is None else settings
        self._dsn = conn_settings.listen_url or dsn
        self._listens = conn_settings.listen
        self._prepare = conn_settings.prepare
        self._poll_s = poll_s
        self._own_pool = pool is None
        if pool is None:
            pool = async_pool(
                dsn, name="deadman-waiter", min_size=1, max_size=2, prepare=self._prepare
            )
        # never retried: a wait's caller decides (the API answers 503, a script retries)
        self._store = WaitStore(pool, retry_s=0)
        self._waits: dict[int, set[asyncio.Future[Job]]] = {}
        self._dirty: set[int] = set()
        self._kick = asyncio.Event()
        #: set while the listener listens; tests read it
        self.connected = asyncio.Event()
        self._started: asyncio.Task[None] | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._closed = False

    async def __aenter__(self) -> AsyncWaiter:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def wait(self, job_id: int, timeout: float) -> Job:
        """The job once it has ended; :class:`WaitTimeout` after ``timeout`` seconds,
        :class:`NotFound` at once for an unknown id (or a job deleted meanwhile)."""
        seconds = _seconds(timeout)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        await self._start()
        answer: asyncio.Future[Job] = loop.create_future()
        self._waits.setdefault(job_id, set()).add(answer)
        try:
            if self._listens:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.connected.wait(), min(seconds, LISTEN_WAIT_S))
            job = await self._store.job_wait_flag(job_id)
            if job is None:
                raise NotFound(f"no job {job_id}")
            if job.state.terminal:
                return job
            try:
                return await asyncio.wait_for(answer, max(0.0, deadline - loop.time()))
            except TimeoutError:
                raise WaitTimeout(job_id, seconds, job.state) from None
        finally:
            self._forget(job_id, answer)

    async def close(self) -> None:
        """Stop listening and checking; waits still running raise WaiterClosed."""
        self._closed = True
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._settle(self._waits, {}, closed=True)
        if self._own_pool and self._started is not None:
            await self._store.close()
        self._started = None

    # -- inside ---------------------------------------------------------------------

    async def _start(self) -> None:
        if self._closed:
            raise WaiterClosed("this waiter is closed")
        if self._started is None:
            self._started = asyncio.create_task(self._open(), name="deadman-waiter-open")
        await asyncio.shield(self._started)

    async def _open(self) -> None:
        if self._own_pool:
            await self._store.open(wait=False)
        self._tasks = [asyncio.create_task(self._check_forever(), name="deadman-waiter-check")]
        if self._listens:
            self._tasks.append(
                asyncio.create_task(self._listen_forever(), name="deadman-waiter-listen")
            )

    def _forget(self, job_id: int, answer: asyncio.Future[Job]) -> None:
        if answer.done() and not answer.cancelled():
            answer.exception()  # retrieved: an answer that came too late is no error
        waits = self._waits.get(job_id)
        if waits is not None:
            waits.discard(answer)
            if not waits:
                del self._waits[job_id]

    def _look(self, ids: Iterable[int]) -> None:
        """Have the checker read these jobs now."""
        self._dirty.update(ids)
        self._kick.set()

    def _settle(self, ids: Iterable[int], found: dict[int, Job], *, closed: bool = False) -> None:
        """Answer the waits on ``ids`` whose job ended (in ``found``) or is gone."""
        for job_id in list(ids):
            job = found.get(job_id)
            if job is not None and not job.state.terminal:
                continue
            for answer in self._waits.get(job_id, ()):
                if answer.done():
                    continue
                if closed:
                    answer.set_exception(WaiterClosed("the waiter was closed"))
                elif job is None:
                    answer.set_exception(NotFound(f"job {job_id} was deleted while waited on"))
                else:
                    answer.set_result(job)

    async def _check_forever(self) -> None:
        """Read what was notified as it comes, and every wait once per ``poll_s``.

        Ends at close() by its cancel, or by ``_closed`` when the cancel was swallowed:
        Python 3.11's ``asyncio.wait_for`` returns the inner result instead of raising
        when the task is cancelled as the kick arrives (close() then waited on this
        loop's next 30 s wait; tests/integration/test_waiting.py reproduces it)."""
        loop = asyncio.get_running_loop()
        next_poll = loop.time() + self._poll_s
        while not self._closed:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._kick.wait(), max(0.0, next_poll - loop.time()))
            self._kick.clear()
            if loop.time() >= next_poll:
                self._dirty.update(self._waits)
                next_poll = loop.time() + self._poll_s
            ids = sorted(self._dirty & self._waits.keys())
            self._dirty.clear()
            if not ids:
                continue
            try:
                jobs = await self._store.job_get_many(ids)
            except Exception as exc:  # the database is away: the next poll reads them again
                log.warning("wait_check_failed", error=repr(exc), jobs=len(ids))
                continue
            self._settle(ids, {job.id: job for job in jobs})

    async def _listen_forever(self) -> None:
        delay = 0.1
        while not self._closed:  # as _check_forever: a swallowed cancel still ends it
            try:
                await self._listen()
            except (psycopg.OperationalError, psycopg.InterfaceError, OSError) as exc:
                log.warning("wait_listener_disconnected", error=str(exc), retry_in_s=delay)
            except Exception as exc:  # a bug: waits fall back to the polls meanwhile
                log.error("wait_listener_crashed", error=repr(exc), retry_in_s=delay)
            if self.connected.is_set():
                delay = 0.1  # it had listened: a fresh outage starts a fresh backoff
            self.connected.clear()
            self._look(self._waits)  # a job may have ended while we were deaf
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)

    async def _listen(self) -> None:
        async with await psycopg.AsyncConnection.connect(
            self._dsn,
            autocommit=True,
            application_name=APPLICATION_NAME,
            prepare_threshold=prepare_threshold(self._prepare),
        ) as conn:
            await conn.execute(QUERIES["listen_done"])
            self.connected.set()
            self._look(self._waits)  # ended before LISTEN took effect
            while not self._closed:
                async for note in conn.notifies(timeout=self._poll_s):
                    job_id = parse_job_id(note.payload)
                    if job_id is not None and job_id in self._waits:
                        self._look((job_id,))
                # the timeout also probes the connection: a dead one raises here
                await conn.execute(QUERIES["ping"])


class Waiter:
    """:class:`AsyncWaiter` for sync code: it runs on an event loop of its own, in a
    daemon thread started at the first wait (one implementation of the waiting, so
    the two cannot drift apart). Thread-safe: any number of threads may wait at once,
    on one listener connection."""

    def __init__(
        self, dsn: str, *, poll_s: float = POLL_S, settings: Settings | None = None
    ) -> None:
        self._dsn = dsn
        self._poll_s = poll_s
        self._settings = settings
        self._lock = threading.Lock()
        self._running: tuple[asyncio.AbstractEventLoop, threading.Thread, AsyncWaiter] | None = None

    def __enter__(self) -> Waiter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def wait(self, job_id: int, timeout: float) -> Job:
        """As :meth:`AsyncWaiter.wait`, blocking the calling thread."""
        _seconds(timeout)  # refused in the caller's thread, before anything starts
        loop, _, waiter = self._start()
        future = asyncio.run_coroutine_threadsafe(waiter.wait(job_id, timeout), loop)
        try:
            return future.result()
        except BaseException:
            future.cancel()  # interrupted (KeyboardInterrupt): stop waiting there too
            raise

    def close(self) -> None:
        with self._lock:
            running, self._running = self._running, None
        if running is None:
            return
        loop, thread, waiter = running
        asyncio.run_coroutine_threadsafe(waiter.close(), loop).result(timeout=30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=30)
        loop.close()

    def _start(self) -> tuple[asyncio.AbstractEventLoop, threading.Thread, AsyncWaiter]:
        with self._lock:
            if self._running is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(
                    target=loop.run_forever, name="deadman-waiter", daemon=True
                )
                thread.start()
                self._running = (
                    loop,
                    thread,
                    AsyncWaiter(self._dsn, poll_s=self._poll_s, settings=self._settings),
                )
            return self._running
