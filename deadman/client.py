"""``deadman.Client``: enqueue jobs from Python.

``enqueue(..., conn=their_connection)`` runs on the caller's psycopg connection, so
the job joins the caller's transaction: invisible until they commit, gone if they
roll back. That is the transactional-outbox pattern without an outbox table.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, Protocol, TypedDict, TypeVar, Unpack

import psycopg
from psycopg_pool import ConnectionPool

from deadman.config import Settings
from deadman.db.pool import sync_pool
from deadman.errors import ConfigError, DuplicateKey
from deadman.model import Backoff, Job, Workflow
from deadman.spec import BatchJobSpec, JobSpec, KeyedName, LimitSpec, validate
from deadman.store import NewJob, NewWorkflow, SyncConn, SyncStore
from deadman.store.limits import Limit


def _to_ms(value: timedelta | float | int | None) -> int | None:
    if value is None:
        return None
    if isinstance(value, timedelta):
        return round(value.total_seconds() * 1000)
    return round(float(value) * 1000)


class JobOptions(TypedDict, total=False):
    """What :meth:`Client.job` and :meth:`Client.enqueue` take besides type and payload:
    the fields of :class:`deadman.JobSpec`, with durations as timedeltas or seconds."""

    queue: str
    priority: int
    run_at: datetime | None
    delay: timedelta | float | None
    max_attempts: int | None
    backoff: Backoff | None
    timeout: timedelta | float | None
    idempotency_key: str | None
    depends_on: Iterable[int | Job]
    start_by: datetime | None
    deadline: datetime | None
    heartbeat_timeout: timedelta | float | None
    limit_key: str | None


#: the options given in seconds, and the spec's field (in milliseconds) for each
_SECONDS = {
    "delay": "delay_ms",
    "timeout": "timeout_ms",
    "heartbeat_timeout": "heartbeat_timeout_ms",
}


class _Keyed(Protocol):
    @property
    def id(self) -> int: ...

    @property
    def request_hash(self) -> str | None: ...


K = TypeVar("K", bound=_Keyed)
R = TypeVar("R")


def _replay(request: NewJob | NewWorkflow, find: Callable[[str], K | None]) -> K:
    """The row a taken key already made, if it was made from the same request (an
    insert makes nothing only on a key conflict)."""
    key = request.idempotency_key
    assert key is not None
    what = "job" if isinstance(request, NewJob) else "workflow"
    existing = find(key)
    if existing is None:  # pragma: no cover - the row was pruned in between
        raise DuplicateKey(f"idempotency key {key!r} is in use")
    if existing.request_hash != request.request_hash():
        raise DuplicateKey(
            f"idempotency key {key!r} was used for a different {what} request "
            f"({what} {existing.id})"
        )
    return existing


class Client:
    """A thread-safe client. ``dsn`` defaults to ``DEADMAN_DATABASE_URL``."""

    def __init__(self, dsn: str | None = None, *, settings: Settings | None = None) -> None:
        self.settings = settings or Settings.from_env()
        self.dsn = dsn or self.settings.database_url
        if not self.dsn:
            raise ConfigError("DEADMAN_DATABASE_URL is not set and no dsn was given")
        self._store = SyncStore()
        self._pool: ConnectionPool[psycopg.Connection[Any]] | None = None
        self._pool_lock = threading.Lock()

    def _get_pool(self) -> ConnectionPool[psycopg.Connection[Any]]:
        with self._pool_lock:
            return self._make_pool()

    def _make_pool(self) -> ConnectionPool[psycopg.Connection[Any]]:
        if self._pool is None:
            # Autocommit: a single enqueue is one statement, so it commits in the same
            # round trip (no separate COMMIT: measured in the latency benchmark); the
            # multi-statement paths open their own transaction.
            self._pool = sync_pool(self.dsn or "", name="deadman-client", max_size=4)
        return self._pool

    def close(self) -> None:
        with self._pool_lock:
            if self._pool is not None:
                self._pool.close()
                self._pool = None

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def job(self, type: str, payload: Any = None, **options: Unpack[JobOptions]) -> NewJob:
        """Build (and validate) a job without sending it; for :meth:`enqueue_many` and
        workflow nodes. The rules are :class:`deadman.JobSpec`'s, as over HTTP: a
        broken field raises :class:`~deadman.spec.SpecError` naming it."""
        body: dict[str, Any] = {"type": type, "payload": payload}
        for name, value in options.items():
            if value is None:
                continue
            if name in _SECONDS:
                body[_SECONDS[name]] = _to_ms(value)  # type: ignore[arg-type]
            elif name == "backoff":
                body[name] = value.to_json() if isinstance(value, Backoff) else value
            elif name == "depends_on":
                body[name] = [d.id if isinstance(d, Job) else d for d in value]  # type: ignore[attr-defined]
            else:
                body[name] = value
        return validate(BatchJobSpec, body).to_new_job()

    def submit(
        self, spec: JobSpec, *, idempotency_key: str | None = None, conn: SyncConn | None = None
    ) -> Job:
        """Enqueue a job given as a :class:`deadman.JobSpec` (e.g. a FastAPI request
        body), as :meth:`enqueue` does."""
        body = spec.model_dump(exclude_unset=True, by_alias=True)
        if idempotency_key is not None:
            body["idempotency_key"] = idempotency_key
        checked = validate(BatchJobSpec, body)
        return self._send(checked.to_new_job(), conn)

    def enqueue(
        self,
        type: str,
        payload: Any = None,
        *,
        conn: SyncConn | None = None,
        **options: Unpack[JobOptions],
    ) -> Job:
        """Enqueue one job and return it; inside ``conn``'s transaction when given.

        With ``idempotency_key``: a repeat of the same request returns the job that
        already exists; the same key with a different request raises
        :class:`DuplicateKey`.

        ``depends_on`` (jobs or ids): the job waits until all of them succeeded, and is
        cancelled if one ends dead or cancelled; an unknown id raises
        :class:`~deadman.store.UnknownDependency`. ``start_by``: not started by then,
        it ends dead ('expired'). ``deadline``: no attempt starts after it ('deadline').
        ``heartbeat_timeout``: the handler must call ``ctx.heartbeat()`` at least that
        often, or its attempt is treated as hung (timed_out). ``delay``, ``timeout`` and
        ``heartbeat_timeout`` are timedeltas or seconds.
        """
        return self._send(self.job(type, payload, **options), conn)

    def _send(self, new: NewJob, conn: SyncConn | None) -> Job:
        return self._on(conn, lambda c: self._enqueue_on(c, new))

    def _on(self, conn: SyncConn | None, work: Callable[[SyncConn], R]) -> R:
        """``work`` on the caller's connection (their transaction), else on ours."""
        if conn is not None:
            return work(conn)
        with self._get_pool().connection() as own:
            return work(own)

    def _enqueue_on(self, conn: SyncConn, new: NewJob) -> Job:
        job = self._store.job_insert(conn, new, self.settings.max_attempts)
        return job or _replay(new, lambda key: self._store.job_get_by_idempotency_key(conn, key))

    def enqueue_many(self, jobs: Iterable[NewJob], *, conn: SyncConn | None = None) -> list[int]:
        """Enqueue many jobs with COPY in one transaction; returns the new ids in order.

        Jobs whose idempotency key already exists are skipped (their ids are not in
        the result).
        """
        batch: Sequence[NewJob] = list(jobs)
        if not batch:
            return []
        if conn is not None:
            if not conn.autocommit:
                # Inside the caller's transaction: theirs to commit or roll back.
                return self._store.job_insert_many(conn, batch, self.settings.max_attempts)
            with conn.transaction():
                return self._store.job_insert_many(conn, batch, self.settings.max_attempts)
        with self._get_pool().connection() as own, own.transaction():
            return self._store.job_insert_many(own, batch, self.settings.max_attempts)

    def workflow(
        self,
        name: str,
        nodes: Mapping[str, NewJob],
        edges: Iterable[tuple[str, str]] = (),
        *,
        idempotency_key: str | None = None,
        conn: SyncConn | None = None,
    ) -> Workflow:
        """Create a workflow: ``nodes`` by name (built with :meth:`job`), ``edges`` as
        (from, to) pairs, ``to`` running after ``from`` succeeded. Every node is created
        in one statement, inside ``conn``'s transaction when given. A duplicate name,
        an unknown node in an edge or a cycle raises
        :class:`~deadman.store.InvalidWorkflow` before anything is sent.

        With ``idempotency_key``: the same workflow again returns the one that exists;
        a different workflow under the same key raises :class:`DuplicateKey`.
        """
        wf = NewWorkflow(
            name=name,
            nodes=tuple(nodes.items()),
            edges=tuple(edges),
            idempotency_key=idempotency_key,
        )
        return self._on(conn, lambda c: self._workflow_on(c, wf))

    def _workflow_on(self, conn: SyncConn, wf: NewWorkflow) -> Workflow:
        made = self._store.workflow_insert(conn, wf, self.settings.max_attempts)
        return made or _replay(
            wf, lambda key: self._store.workflow_get_by_idempotency_key(conn, key)
        )

    def get_workflow(self, workflow_id: int) -> Workflow | None:
        return self._on(None, lambda c: self._store.workflow_get(c, workflow_id))

    def get(self, job_id: int) -> Job | None:
        return self._on(None, lambda c: self._store.job_get(c, job_id))

    # -- flow control ------------------------------------------------------------------

    def set_limit(
        self,
        key: str,
        *,
        concurrency: int | None = None,
        rate: tuple[int, timedelta | float] | None = None,
    ) -> Limit:
        """Create or replace ``key``'s limit: at most ``concurrency`` of its jobs
        running at once across the fleet; at most ``rate[0]`` starts in any window of
        ``rate[1]`` (a timedelta, or seconds). It applies from the next claim. The rules
        are :class:`deadman.spec.LimitSpec`'s, as for ``PUT /limits/{key}``."""
        body: dict[str, Any] = {"concurrency": concurrency}
        if rate is not None:
            body["rate"] = {"count": rate[0], "per_ms": _to_ms(rate[1])}
        spec = validate(LimitSpec, body)
        name = validate(KeyedName, {"key": key}).key
        return self._on(None, lambda c: self._store.limit_put(c, spec.params(name)))

    def limits(self) -> list[Limit]:
        """Every limit and its live state (``running``, ``available``), by key."""
        return self._on(None, self._store.limit_list)

    def limit(self, key: str) -> Limit | None:
        return self._on(None, lambda c: self._store.limit_get(c, key))

    def delete_limit(self, key: str) -> bool:
        """Remove ``key``'s limit; False if it had none. Its jobs then run unlimited."""
        return self._on(None, lambda c: self._store.limit_delete(c, key))
