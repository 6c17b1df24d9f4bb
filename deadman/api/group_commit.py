"""Group commit for ``POST /jobs``: concurrent single submissions share one statement,
one transaction and one WAL flush.

No timer, as in the worker's completer (deadman/worker/completer.py): a group is
written as soon as there is something to write and no group is being written; what
arrives meanwhile goes into the next one. Idle, a submission is written at once, by
itself; under load, groups grow by themselves (up to ``group_max``). Each request is
still answered only after *its* row is durable: its future resolves when the
statement that inserted it has returned, in autocommit with synchronous_commit on.

What each caller gets is what ``AsyncStore.job_insert`` would have given it: its new
job, None if its idempotency key is taken (the caller then reads the job holding it,
deadman.api.idempotency), or the error its own insert would have raised.

- Two submissions with the same key never share a group: the later waits for the
  next one, and then finds the key taken, as it would have one after the other.
- One row the database refuses must not fail the others: when a group is refused
  with an error that means nothing was committed (a constraint, a bad value, a
  deadlock or a cancelled statement), each of its jobs is inserted again on its own
  (``job_insert``, the path without group commit), and only the bad one fails.
- An error that leaves the outcome unknown (the connection broke, possibly after the
  COMMIT) fails every request of the group with it (503): inserting key-less jobs
  again could store them twice. This is what the single insert does (the API's store
  never retries), and the client retries, ideally with a key.
- Jobs with ``depends_on`` do not come here: their insert locks the dependencies
  and writes the edges in a transaction of its own.
"""

from __future__ import annotations

import asyncio
import functools
from collections import deque
from dataclasses import dataclass, field

import psycopg

from deadman import logs
from deadman.api.telemetry import GROUP_SIZE
from deadman.errors import DatabaseUnavailable, DuplicateKey, InvalidJob
from deadman.model import Job
from deadman.store import AsyncStore, NewJob
from deadman.store.submissions import job_insert_grouped

log = logs.get("deadman.api.group_commit")

#: At most this many submissions in one statement (the rest wait for the next).
GROUP_MAX = 200
#: Groups written at once, each on its own pooled connection.
IN_FLIGHT = 1

#: SQLSTATE classes of errors after which the statement may have committed, or the
#: session is gone: connection exceptions, operator intervention (a terminated
#: backend), insufficient resources, system and internal errors.
_OUTCOME_UNKNOWN = ("08", "57P", "53", "58", "XX")


@dataclass
class _Pending:
    job: NewJob
    future: asyncio.Future[Job | None] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


class GroupCommit:
    """Inserts single submissions in groups; see the module's docstring."""

    def __init__(
        self,
        store: AsyncStore,
        default_max_attempts: int,
        *,
        group_max: int = GROUP_MAX,
        in_flight: int = IN_FLIGHT,
    ) -> None:
        self._store = store
        self._default_max_attempts = default_max_attempts
        self._group_max = group_max
        self._in_flight = in_flight
        self._pending: deque[_Pending] = deque()
        self._writing: set[asyncio.Task[None]] = set()
        #: groups written, and submissions written in them (tests and metrics read)
        self.groups = 0
        self.grouped = 0

    @property
    def waiting(self) -> int:
        """Submissions waiting for a group (not yet being written)."""
        return len(self._pending)

    @property
    def writing(self) -> int:
        """Groups being written now."""
        return len(self._writing)

    async def insert(self, job: NewJob) -> Job | None:
        """``job`` inserted, once its group committed; None: its key is taken."""
        if job.depends_on:
            return await self._store.job_insert(job, self._default_max_attempts)
        item = _Pending(job)
        self._pending.append(item)
        self._start()
        return await item.future

    async def close(self) -> None:
        """Wait for the groups being written (the server is stopping; requests in
        flight are answered first)."""
        while self._writing or self._pending:
            if self._writing:
                await asyncio.wait(set(self._writing))
            else:
                self._start()

    def _start(self) -> None:
        while self._pending and len(self._writing) < self._in_flight:
            group = self._next_group()
            if not group:
                continue
            task = asyncio.create_task(self._write(group))
            self._writing.add(task)
            task.add_done_callback(functools.partial(self._written, group))

    def _written(self, group: list[_Pending], task: asyncio.Task[None]) -> None:
        """A group ended: start the next. ``_write`` settles every request of its
        group; if it raised anyway (a bug) or was cancelled, its requests get that
        error rather than waiting for ever."""
        self._writing.discard(task)
        failure: BaseException | None = (
            asyncio.CancelledError() if task.cancelled() else task.exception()
        )
        if failure is not None:
            log.error("group_commit_failed", error=repr(failure))
            for item in group:
                _fail(item, failure)
        self._start()

    def _next_group(self) -> list[_Pending]:
        """Up to group_max waiting submissions, keys unique among them (a second one
        with a key already in the group waits, in its place, for the next)."""
        group: list[_Pending] = []
        keys: set[str] = set()
        later: list[_Pending] = []
        while self._pending and len(group) < self._group_max:
            item = self._pending.popleft()
            if item.future.done():  # its request was cancelled before it was written
                continue
            key = item.job.idempotency_key
            if key is not None:
                if key in keys:
                    later.append(item)
                    continue
                keys.add(key)
            group.append(item)
        self._pending.extendleft(reversed(later))
        return group

    async def _write(self, group: list[_Pending]) -> None:
        jobs = [item.job for item in group]
        try:
            rows = await job_insert_grouped(self._store, jobs, self._default_max_attempts)
        except Exception as exc:
            if len(group) == 1 or not refused(exc):
                for item in group:
                    _fail(item, exc)
                return
            log.warning("group_refused", size=len(group), error=repr(exc)[:500])
            await self._one_by_one(group)
            return
        self.groups += 1
        self.grouped += len(group)
        GROUP_SIZE.observe(len(group))
        for item, row in zip(group, rows, strict=True):
            if not item.future.done():
                item.future.set_result(row)

    async def _one_by_one(self, group: list[_Pending]) -> None:
        """Each job of a refused group on its own: only the bad ones fail."""
        for item in group:
            try:
                row = await self._store.job_insert(item.job, self._default_max_attempts)
            except Exception as exc:
                _fail(item, exc)
            else:
                if not item.future.done():
                    item.future.set_result(row)


def refused(exc: BaseException) -> bool:
    """Whether ``exc`` means the statement committed nothing, so that its rows can be
    inserted again one by one: a value refused before it was sent, or an error the
    server answered the statement with (its transaction rolled back) that does not
    end the session."""
    if isinstance(exc, InvalidJob | DuplicateKey | UnicodeError):
        return True
    if isinstance(exc, DatabaseUnavailable):
        cause = exc.__cause__
        state = cause.sqlstate if isinstance(cause, psycopg.Error) else None
        return bool(state) and not str(state).startswith(_OUTCOME_UNKNOWN)
    return False


def _fail(item: _Pending, exc: BaseException) -> None:
    if not item.future.done():
        item.future.set_exception(exc)
