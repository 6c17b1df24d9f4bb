"""The store: the only seam between Deadman and Postgres.

One method per named query in ``db/queries.sql`` (noun_verb: ``job_insert``,
``job_claim``, ...), parameters as frozen dataclasses where there are more than
two. Psycopg errors become Deadman errors here and nowhere else (``translate``).

``AsyncStore`` serves the worker and the API (asyncio). ``SyncStore`` serves the
Python client and sync handlers; it takes the caller's connection so that an
enqueue can join the caller's own transaction.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, LiteralString, Self

import psycopg
from psycopg.rows import DictRow, dict_row, tuple_row
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool
from tenacity import (
    AsyncRetrying,
    retry_if_exception_type,
    stop_after_delay,
    wait_exponential,
    wait_random,
)

from deadman.db.queries import QUERIES
from deadman.errors import DatabaseUnavailable, InvalidJob, translate
from deadman.model import (
    TYPE_RE,
    AttemptOutcome,
    Backoff,
    Job,
    JobState,
    Workflow,
    check_transition,
    find_cycle,
    validate_max_attempts,
    validate_priority,
    validate_queue,
    validate_type,
)

AsyncConn = psycopg.AsyncConnection[DictRow]
SyncConn = psycopg.Connection[Any]


# --------------------------------------------------------------------------- params

MAX_DELAY_MS = 10 * 365 * 24 * 3600 * 1000
MAX_TIMEOUT_MS = 2**31 - 1  # the column is an integer


@dataclass(frozen=True)
class NewJob:
    """A job to enqueue. Validated on construction: bad input never reaches SQL."""

    type: str
    payload: Any = None
    queue: str = "default"
    priority: int = 0
    run_at: datetime | None = None
    delay_ms: int = 0
    max_attempts: int | None = None  # None: DEADMAN_MAX_ATTEMPTS
    backoff: Backoff = field(default_factory=Backoff)
    timeout_ms: int | None = None
    idempotency_key: str | None = None
    #: ids of jobs that must succeed first (the job waits; see job_deps_lock)
    depends_on: tuple[int, ...] = ()
    #: schedule-to-start: not started by then, the job ends dead ('expired')
    start_by: datetime | None = None
    #: total across retries: no attempt starts after it ('deadline')
    deadline: datetime | None = None
    heartbeat_timeout_ms: int | None = None

    def __post_init__(self) -> None:
        validate_type(self.type)
        validate_queue(self.queue)
        validate_priority(self.priority)
        if self.run_at is not None and self.delay_ms:
            raise InvalidJob("give run_at or delay, not both")
        if self.run_at is not None and self.run_at.tzinfo is None:
            raise InvalidJob("run_at must carry a time zone")
        if self.delay_ms < 0:
            raise InvalidJob("delay must not be negative")
        if self.delay_ms > MAX_DELAY_MS:
            raise InvalidJob(f"delay must be at most {MAX_DELAY_MS} ms (10 years)")
        if self.max_attempts is not None:
            validate_max_attempts(self.max_attempts)
        if self.timeout_ms is not None and not 0 < self.timeout_ms <= MAX_TIMEOUT_MS:
            raise InvalidJob(f"timeout must be between 1 and {MAX_TIMEOUT_MS} ms")
        if self.idempotency_key is not None and not 1 <= len(self.idempotency_key) <= 255:
            raise InvalidJob("idempotency_key must be 1-255 characters")
        for name in ("start_by", "deadline"):
            value = getattr(self, name)
            if value is not None and value.tzinfo is None:
                raise InvalidJob(f"{name} must carry a time zone")
        if self.heartbeat_timeout_ms is not None and not (
            0 < self.heartbeat_timeout_ms <= MAX_TIMEOUT_MS
        ):
            raise InvalidJob(f"heartbeat timeout must be between 1 and {MAX_TIMEOUT_MS} ms")
        if len(set(self.depends_on)) != len(self.depends_on):
            raise InvalidJob("depends_on names a job twice")

    def request_hash(self) -> str:
        """A fingerprint of what was asked, to tell a replay from a different request."""
        body = {
            "type": self.type,
            "payload": self.payload,
            "queue": self.queue,
            "priority": self.priority,
            "run_at": self.run_at.astimezone(UTC).isoformat() if self.run_at else None,
            "delay_ms": self.delay_ms,
            "max_attempts": self.max_attempts,
            "backoff": self.backoff.to_json(),
            "timeout_ms": self.timeout_ms,
        }
        # Only when given: the hashes of jobs that do not use them stay as they were.
        if self.depends_on:
            body["depends_on"] = list(self.depends_on)
        for name in ("start_by", "deadline"):
            value = getattr(self, name)
            if value is not None:
                body[name] = value.astimezone(UTC).isoformat()
        if self.heartbeat_timeout_ms is not None:
            body["heartbeat_timeout_ms"] = self.heartbeat_timeout_ms
        raw = json.dumps(body, sort_keys=True, separators=(",", ":"), default=str)
        return hashlib.sha256(raw.encode()).hexdigest()

    def params(
        self,
        default_max_attempts: int,
        *,
        pending_deps: int = 0,
        upstream_error: str | None = None,
    ) -> dict[str, Any]:
        """job_insert's parameters; ``pending_deps``/``upstream_error`` come from
        job_deps_lock (see :func:`deps_verdict`). The request's fingerprint only
        matters (and is only computed) when there is an idempotency key."""
        return {
            "type": self.type,
            "queue": self.queue,
            "priority": self.priority,
            "payload": Jsonb(self.payload),
            "run_at": self.run_at,
            "delay_ms": self.delay_ms,
            "max_attempts": self.max_attempts or default_max_attempts,
            "backoff": Jsonb(self.backoff.to_json()),
            "timeout_ms": self.timeout_ms,
            "idempotency_key": self.idempotency_key,
            "request_hash": self.request_hash() if self.idempotency_key else None,
            "pending_deps": pending_deps,
            "upstream_error": upstream_error,
            "start_by": self.start_by,
            "deadline": self.deadline,
            "heartbeat_timeout_ms": self.heartbeat_timeout_ms,
        }


def deps_verdict(wanted: Sequence[int], rows: Sequence[Any]) -> tuple[int, str | None]:
    """From job_deps_lock's rows: (dependencies not yet succeeded, the reason to be
    born cancelled if one already ended dead or cancelled). Unknown ids: InvalidJob."""
    found = {int(r["id"]): r for r in rows}
    missing = [i for i in wanted if i not in found]
    if missing:
        raise UnknownDependency(missing)
    pending = sum(1 for r in found.values() if r["state"] != JobState.SUCCEEDED.value)
    failed = sorted(
        (i, r) for i, r in found.items() if r["state"] in (JobState.DEAD, JobState.CANCELLED)
    )
    if failed:
        _, row = failed[0]
        return 0, f"upstream {row['name']} {row['state']}"
    return pending, None


class UnknownDependency(InvalidJob):
    """``depends_on`` names jobs that do not exist (or were pruned); ``index``: which
    job of a batch."""

    def __init__(self, ids: Sequence[int], index: int | None = None) -> None:
        super().__init__("depends_on names unknown jobs: " + ", ".join(map(str, ids)))
        self.ids = tuple(ids)
        self.index = index


@dataclass(frozen=True)
class ClaimParams:
    queue: str
    worker: str
    limit: int
    ttl_ms: int
    #: jobs rescued this many times are quarantined: claimed only alone
    quarantine_at: int = 5


@dataclass(frozen=True)
class Finish:
    """How one attempt ended, as the worker reports it (fenced by ``token``)."""

    id: int
    token: int
    state: JobState
    outcome: AttemptOutcome
    delay_ms: int = 0
    error: str | None = None
    result: Any = None

    def __post_init__(self) -> None:
        check_transition(JobState.RUNNING, self.state)


@dataclass(frozen=True)
class HeartbeatParams:
    worker: str
    hostname: str
    pid: int
    queues: Sequence[str]
    concurrency: int
    ttl_ms: int
    leases: Sequence[tuple[int, int]]  # (job id, lease token)


@dataclass(frozen=True)
class RescueParams:
    max_rescues: int
    limit: int = 1000
    #: a leader idle this long inside its tick's transaction loses its session
    idle_ms: int = 5000

    @property
    def quarantine_at(self) -> int:
        return quarantine_at(self.max_rescues)


def quarantine_at(max_rescues: int) -> int:
    """Rescues after which a job only runs alone (see job_rescue_expired)."""
    return max(max_rescues, 1)


@dataclass(frozen=True)
class PruneParams:
    succeeded_ms: int
    failed_ms: int
    limit: int = 1000


@dataclass(frozen=True)
class Rescued:
    id: int
    state: JobState
    queue: str
    #: the job and the lease that lapsed, for the log line (absent: not known)
    type: str = ""
    attempt: int = 0
    lease_token: int = 0
    worker: str = ""

    @classmethod
    def from_row(cls, r: DictRow) -> Rescued:
        return cls(
            int(r["id"]),
            JobState(r["state"]),
            r["queue"],
            r.get("type") or "",
            int(r.get("attempt") or 0),
            int(r.get("lease_token") or 0),
            r.get("lease_worker") or "",
        )


#: How long a handler's transaction may sit idle after its fenced completion before
#: the server ends it (see tx_idle_limit): the COMMIT follows at once, so only a
#: paused or partitioned worker ever comes near it.
FINISH_IDLE_MS = 5000


def finish_params(finishes: Sequence[Finish]) -> dict[str, Any]:
    """The batch as one JSON document (see job_finish_many) and its ids, which let
    the planner go straight to the primary key."""
    batch = [
        {
            "id": f.id,
            "token": f.token,
            "state": f.state.value,
            "outcome": f.outcome.value,
            "delay_ms": f.delay_ms,
            "error": None if f.error is None else _storable(f.error),
            "result": f.result,
        }
        for f in finishes
    ]
    return {"batch": json.dumps(batch, ensure_ascii=False), "ids": [f.id for f in finishes]}


def _storable(text: str) -> str:
    """An error message must never sink its batch: Postgres text cannot hold NUL, and
    a lone surrogate (from a badly decoded exception message) is not UTF-8."""
    return text.replace("\x00", "\\x00").encode("utf-8", "backslashreplace").decode("utf-8")


def claim_params(p: ClaimParams) -> dict[str, Any]:
    return {
        "queue": p.queue,
        "worker": p.worker,
        "limit": p.limit,
        "ttl_ms": p.ttl_ms,
        "quarantine_at": p.quarantine_at,
    }


def heartbeat_params(p: HeartbeatParams) -> dict[str, Any]:
    return {
        "worker": p.worker,
        "hostname": p.hostname,
        "pid": p.pid,
        "queues": list(p.queues),
        "concurrency": p.concurrency,
        "ttl_ms": p.ttl_ms,
        "ids": [i for i, _ in p.leases],
        "tokens": [t for _, t in p.leases],
    }


def _ms(value: timedelta | None) -> float | None:
    return None if value is None else value.total_seconds() * 1000.0


#: Finished jobs of one state are counted exactly up to this many, then estimated.
FINISHED_COUNT_CAP = 10_000


@dataclass(frozen=True)
class ListParams:
    """One page of the job listing: filters (None: any) and the keyset cursor."""

    limit: int
    state: JobState | None = None
    type: str | None = None
    queue: str | None = None
    before_id: int | None = None  # only jobs with a smaller id (the previous page's last)


@dataclass(frozen=True)
class BatchInserted:
    """The outcome of a batch insert, index by index with the input.

    ``jobs[i]`` is the row for input ``i`` and ``created[i]`` False when it was a
    replay of an existing job. When ``mismatched`` (inputs whose idempotency key
    belongs to a job made from a different request) or ``vanished`` (a replayed row
    deleted meanwhile) is non-empty, nothing was committed and ``jobs`` is partial.
    """

    jobs: tuple[Job, ...]
    created: tuple[bool, ...]
    mismatched: tuple[int, ...] = ()
    vanished: tuple[int, ...] = ()


#: The most nodes and edges one workflow may have.
MAX_NODES = 1000
MAX_EDGES = 10_000


class InvalidWorkflow(InvalidJob):
    """A workflow that is not a DAG of uniquely named nodes."""


@dataclass(frozen=True)
class NewWorkflow:
    """A validated DAG: node names unique, edges between known nodes, no cycle.

    The API checks each field first to name it in its 422; this is the same rule for
    every other caller (``Client.workflow``)."""

    name: str
    nodes: tuple[tuple[str, NewJob], ...]
    edges: tuple[tuple[str, str], ...]  # (from, to): `to` waits for `from`
    idempotency_key: str | None = None

    def __post_init__(self) -> None:
        if not 1 <= len(self.name) <= 128:
            raise InvalidWorkflow("a workflow's name must be 1-128 characters")
        if not 1 <= len(self.nodes) <= MAX_NODES:
            raise InvalidWorkflow(f"a workflow has 1 to {MAX_NODES} nodes")
        if len(self.edges) > MAX_EDGES:
            raise InvalidWorkflow(f"a workflow has at most {MAX_EDGES} edges")
        names = [n for n, _ in self.nodes]
        seen: set[str] = set()
        for n in names:
            if not TYPE_RE.fullmatch(n):  # node names follow the job type rule
                raise InvalidWorkflow(f"node name {n!r}: 1-128 of A-Z a-z 0-9 _ . : -")
            if n in seen:
                raise InvalidWorkflow(f"two nodes are named {n!r}")
            seen.add(n)
        for n, job in self.nodes:
            if job.depends_on or job.idempotency_key is not None:
                raise InvalidWorkflow(
                    f"node {n!r}: use edges, not depends_on; the key is the workflow's"
                )
        if len(set(self.edges)) != len(self.edges):
            raise InvalidWorkflow("an edge is given twice")
        for src, dst in self.edges:
            if src not in seen or dst not in seen:
                raise InvalidWorkflow(f"edge {src!r} -> {dst!r} names an unknown node")
            if src == dst:
                raise InvalidWorkflow(f"node {src!r} cannot depend on itself")
        cycle = find_cycle(names, self.edges)
        if cycle:
            raise InvalidWorkflow("the edges form a cycle: " + " -> ".join(cycle))
        if self.idempotency_key is not None and not 1 <= len(self.idempotency_key) <= 255:
            raise InvalidWorkflow("idempotency_key must be 1-255 characters")

    def request_hash(self) -> str:
        """A fingerprint of the whole request (name, each node, edges), as for jobs."""
        body = {
            "name": self.name,
            "nodes": [[n, j.request_hash()] for n, j in self.nodes],
            "edges": sorted(self.edges),
        }
        raw = json.dumps(body, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(raw.encode()).hexdigest()


def workflow_params(wf: NewWorkflow, default_max_attempts: int) -> dict[str, Any]:
    indegree = {name: 0 for name, _ in wf.nodes}
    outgoing: set[str] = set()
    for src, dst in wf.edges:
        indegree[dst] += 1
        outgoing.add(src)
    jobs = [j for _, j in wf.nodes]
    return {
        "name": wf.name,
        "nodes_count": len(jobs),
        "idempotency_key": wf.idempotency_key,
        "request_hash": wf.request_hash() if wf.idempotency_key is not None else None,
        "ords": list(range(len(jobs))),
        "nodes": [name for name, _ in wf.nodes],
        "types": [j.type for j in jobs],
        "queues": [j.queue for j in jobs],
        "priorities": [j.priority for j in jobs],
        "payloads": [Jsonb(j.payload) for j in jobs],
        "max_attempts": [j.max_attempts or default_max_attempts for j in jobs],
        "backoffs": [Jsonb(j.backoff.to_json()) for j in jobs],
        "timeouts_ms": [j.timeout_ms for j in jobs],
        "run_ats": [j.run_at for j in jobs],
        "delays_ms": [j.delay_ms for j in jobs],
        "pending": [indegree[name] for name, _ in wf.nodes],
        "has_dependents": [name in outgoing for name, _ in wf.nodes],
        "start_bys": [j.start_by for j in jobs],
        "deadlines": [j.deadline for j in jobs],
        "heartbeat_timeouts_ms": [j.heartbeat_timeout_ms for j in jobs],
        "froms": [a for a, _ in wf.edges],
        "tos": [b for _, b in wf.edges],
    }


def batch_params(
    jobs: Sequence[NewJob],
    default_max_attempts: int,
    verdicts: Sequence[tuple[int, str | None]] | None = None,
) -> dict[str, Any]:
    """job_insert_many_returning's arrays; ``verdicts[i]`` is job i's (pending
    dependencies, upstream error) from :func:`batch_verdicts` (none: no depends_on)."""
    verdicts = verdicts or [(0, None)] * len(jobs)
    return {
        "ords": list(range(len(jobs))),
        "types": [j.type for j in jobs],
        "queues": [j.queue for j in jobs],
        "priorities": [j.priority for j in jobs],
        "payloads": [Jsonb(j.payload) for j in jobs],
        "max_attempts": [j.max_attempts or default_max_attempts for j in jobs],
        "backoffs": [Jsonb(j.backoff.to_json()) for j in jobs],
        "timeouts_ms": [j.timeout_ms for j in jobs],
        "run_ats": [j.run_at for j in jobs],
        "delays_ms": [j.delay_ms for j in jobs],
        "idempotency_keys": [j.idempotency_key for j in jobs],
        "request_hashes": [j.request_hash() if j.idempotency_key else None for j in jobs],
        "pending_deps": [v[0] for v in verdicts],
        "upstream_errors": [v[1] for v in verdicts],
        "start_bys": [j.start_by for j in jobs],
        "deadlines": [j.deadline for j in jobs],
        "heartbeat_timeouts_ms": [j.heartbeat_timeout_ms for j in jobs],
    }


def batch_dependencies(jobs: Sequence[NewJob]) -> list[int]:
    """Every job id the batch depends on, once, in id order (the lock order)."""
    return sorted({d for j in jobs for d in j.depends_on})


def batch_verdicts(jobs: Sequence[NewJob], rows: Sequence[Any]) -> list[tuple[int, str | None]]:
    """deps_verdict for each job of a batch from one job_deps_lock of all their
    dependencies; an unknown id raises UnknownDependency naming the job's index."""
    verdicts = []
    for i, job in enumerate(jobs):
        wanted = set(job.depends_on)
        try:
            verdicts.append(
                deps_verdict(job.depends_on, [r for r in rows if int(r["id"]) in wanted])
            )
        except UnknownDependency as exc:
            raise UnknownDependency(exc.ids, index=i) from None
    return verdicts


def batch_edges(jobs: Sequence[NewJob], result: BatchInserted) -> dict[str, list[int]]:
    """job_deps_insert_many's pairs: the dependencies of each job the batch created."""
    job_ids: list[int] = []
    deps: list[int] = []
    for new, row, created in zip(jobs, result.jobs, result.created, strict=True):
        if created:
            job_ids += [row.id] * len(new.depends_on)
            deps += new.depends_on
    return {"job_ids": job_ids, "depends_on": deps}


def match_batch(
    jobs: Sequence[NewJob], inserted: Sequence[Job], existing: Sequence[Job]
) -> BatchInserted:
    """Pair each input with its row: inserted rows by key, or (key-less) by id order,
    which is input order (job_insert_many_returning inserts in that order); skipped
    keyed rows with the existing job, a replay only if its request hash matches."""
    by_key = {j.idempotency_key: j for j in inserted if j.idempotency_key is not None}
    unkeyed = iter(sorted((j for j in inserted if j.idempotency_key is None), key=lambda j: j.id))
    old = {j.idempotency_key: j for j in existing}
    out: list[Job] = []
    created: list[bool] = []
    mismatched: list[int] = []
    vanished: list[int] = []
    for i, new in enumerate(jobs):
        key = new.idempotency_key
        if key is None:
            out.append(next(unkeyed))
            created.append(True)
        elif key in by_key:
            out.append(by_key[key])
            created.append(True)
        elif key in old:
            if old[key].request_hash == new.request_hash():
                out.append(old[key])
                created.append(False)
            else:
                mismatched.append(i)
        else:
            vanished.append(i)
    return BatchInserted(tuple(out), tuple(created), tuple(mismatched), tuple(vanished))


# --------------------------------------------------------------------------- async


class AsyncStore:
    """Async access for the worker and the API, over a connection pool.

    Single-statement operations run in autocommit and are retried on transient
    connection trouble (a Postgres restart, a killed backend) for up to
    ``retry_s`` seconds; the pool replaces connections that are no longer usable.
    Retrying a fenced write is safe: if the first try had committed, the retry
    matches no row and reports the lease as lost, never a double effect.
    """

    def __init__(self, pool: AsyncConnectionPool[AsyncConn], retry_s: float = 30.0) -> None:
        self.pool = pool
        self.retry_s = retry_s

    @classmethod
    def create(
        cls,
        dsn: str,
        *,
        min_size: int = 1,
        max_size: int = 10,
        retry_s: float = 30.0,
        timeout: float = 10.0,
    ) -> Self:
        """``timeout``: longest wait for a pooled connection; a worker keeps it well
        under its lease trust window so a stalled pool surfaces before leases lapse."""
        pool: AsyncConnectionPool[AsyncConn] = AsyncConnectionPool(
            dsn,
            min_size=min_size,
            max_size=max_size,
            kwargs={"autocommit": True, "row_factory": dict_row},
            open=False,
            timeout=timeout,
            # psycopg_pool gives up reconnecting after this long (0 would mean: at
            # once); a worker must outlive any database outage, so: a year.
            reconnect_timeout=365 * 24 * 3600.0,
            name="deadman",
        )
        return cls(pool, retry_s=retry_s)

    async def open(self, wait: bool = True, timeout: float = 30.0) -> None:
        await self.pool.open(wait=wait, timeout=timeout)

    async def close(self) -> None:
        await self.pool.close()

    async def _all(
        self,
        name: LiteralString,
        params: dict[str, Any],
        retry_s: float | None = None,
        *,
        prepare: bool | None = None,
    ) -> list[DictRow]:
        # The first try runs outside tenacity: building and driving its retry state
        # costs ~0.15 ms per statement (measured), on every claim's critical path,
        # and almost every statement succeeds at once. Only a failure pays for it.
        started = time.monotonic()
        try:
            return await self._once(name, params, prepare)
        except DatabaseUnavailable:
            budget = (self.retry_s if retry_s is None else retry_s) - (time.monotonic() - started)
            if budget <= 0:
                raise
        await asyncio.sleep(random.uniform(0.05, 0.1))  # the wait tenacity puts after try 1
        async for attempt in AsyncRetrying(
            retry=retry_if_exception_type(DatabaseUnavailable),
            stop=stop_after_delay(budget),
            wait=wait_exponential(multiplier=0.05, max=2.0) + wait_random(0, 0.05),
            reraise=True,
        ):
            with attempt:
                return await self._once(name, params, prepare)
        raise AssertionError("unreachable")  # pragma: no cover

    async def _once(
        self, name: LiteralString, params: dict[str, Any], prepare: bool | None
    ) -> list[DictRow]:
        with translate():
            async with self.pool.connection() as conn:
                cur = await conn.execute(QUERIES[name], params, prepare=prepare)
                return await cur.fetchall() if cur.description else []

    # -- enqueue and read ----------------------------------------------------------

    async def job_insert(self, job: NewJob, default_max_attempts: int) -> Job | None:
        if job.depends_on:
            return await self._job_insert_with_deps(job, default_max_attempts)
        # Without an idempotency key a retry after a lost COMMIT acknowledgement would
        # insert the job twice, so only keyed inserts are retried.
        rows = await self._all(
            "job_insert",
            job.params(default_max_attempts),
            retry_s=None if job.idempotency_key else 0,
        )
        return Job.from_row(rows[0]) if rows else None

    async def _job_insert_with_deps(self, job: NewJob, default_max_attempts: int) -> Job | None:
        """Lock the dependencies, insert the job, insert its edges: one transaction."""
        deps = list(job.depends_on)
        with translate():
            async with self.pool.connection() as conn, conn.transaction():
                cur = await conn.execute(QUERIES["job_deps_lock"], {"ids": deps})
                pending, upstream = deps_verdict(deps, await cur.fetchall())
                cur = await conn.execute(
                    QUERIES["job_insert"],
                    job.params(
                        default_max_attempts,
                        pending_deps=pending,
                        upstream_error=upstream,
                    ),
                )
                row = await cur.fetchone()
                if row is None:
                    return None
                await conn.execute(
                    QUERIES["job_deps_insert"], {"job_id": row["id"], "depends_on": deps}
                )
                return Job.from_row(row)

    async def job_get(self, job_id: int) -> Job | None:
        rows = await self._all("job_get", {"id": job_id})
        return Job.from_row(rows[0]) if rows else None

    async def job_get_many(self, ids: Sequence[int]) -> list[Job]:
        rows = await self._all("job_get_many", {"ids": list(ids)})
        return [Job.from_row(r) for r in rows]

    async def job_attempts(self, job_id: int) -> list[DictRow]:
        return await self._all("job_attempts", {"id": job_id})

    # -- the worker's path ---------------------------------------------------------

    async def job_claim(self, p: ClaimParams, retry_s: float | None = None) -> list[Job]:
        rows = await self._all("job_claim", claim_params(p), retry_s)
        return await self._readable(rows)

    async def job_claim_quarantined(
        self, p: ClaimParams, retry_s: float | None = None
    ) -> list[Job]:
        """At most one quarantined job; only for a worker that holds nothing else."""
        rows = await self._all("job_claim_quarantined", claim_params(p), retry_s)
        return await self._readable(rows)

    async def _readable(self, rows: Sequence[DictRow]) -> list[Job]:
        """The claimed rows as jobs. A row this code cannot read (a backoff or payload
        written by hand, or by a newer version) ends dead at once, fenced by the
        token just taken, with the reason; its batch-mates are claimed as usual.
        Raising instead lost the whole batch's claim to the rescuer, a rescue
        counted against every job in it."""
        jobs: list[Job] = []
        broken: list[Finish] = []
        for r in rows:
            try:
                jobs.append(Job.from_row(r))
            except Exception as exc:
                error = f"the job row cannot be read by this worker: {exc!r}"[:2000]
                outcome = AttemptOutcome.FAILED
                broken.append(
                    Finish(int(r["id"]), int(r["lease_token"]), JobState.DEAD, outcome, error=error)
                )
        if broken:
            await self.job_finish_many(broken)
        return jobs

    async def job_quarantine_pending(self, queues: Sequence[str], quarantine_at: int) -> bool:
        rows = await self._all(
            "job_quarantine_pending", {"queues": list(queues), "quarantine_at": quarantine_at}
        )
        return bool(rows and rows[0]["pending"])

    async def job_next_run_at(self, queue: str) -> float | None:
        """Milliseconds until the queue's next not-yet-due job, or None if there is none."""
        rows = await self._all("job_next_run_at", {"queue": queue})
        return _ms(rows[0]["wait"]) if rows else None

    async def job_finish_many(self, finishes: Sequence[Finish]) -> set[int]:
        """End attempts; returns the ids that were still ours. Missing ids: lease lost."""
        if not finishes:
            return set()
        # Prepared: its generic plan goes through the primary key and is the fastest
        # at every batch size (DECISIONS.md 25).
        rows = await self._all("job_finish_many", finish_params(finishes))
        return {int(r["id"]) for r in rows}

    async def job_finish_in(
        self, conn: AsyncConn, finishes: Sequence[Finish], idle_ms: int = FINISH_IDLE_MS
    ) -> set[int]:
        """Like job_finish_many, on the caller's connection and inside its transaction,
        which the server ends if it then sits idle for ``idle_ms`` (tx_idle_limit)."""
        with translate():
            # Two round trips: in pipeline mode the server did not arm the idle timer.
            await conn.execute(QUERIES["tx_idle_limit"], {"idle_ms": idle_ms})
            cur = await conn.execute(QUERIES["job_finish_many"], finish_params(finishes))
            return {int(r["id"]) for r in await cur.fetchall()}

    async def job_heartbeat_many(
        self, p: HeartbeatParams, retry_s: float | None = None
    ) -> dict[int, bool]:
        """Renew leases; returns {job id: cancel requested} for the leases still ours."""
        rows = await self._all("job_heartbeat_many", heartbeat_params(p), retry_s)
        return {int(r["id"]): bool(r["cancel_requested"]) for r in rows}

    async def worker_deregister(self, worker: str) -> None:
        await self._all("worker_deregister", {"worker": worker})

    async def worker_prune_stale(self, older_than_ms: int) -> None:
        await self._all("worker_prune_stale", {"older_than_ms": older_than_ms})

    async def queue_notify(self, queues: Sequence[str]) -> None:
        if queues:
            await self._all("queue_notify", {"queues": sorted(set(queues))})

    # -- the rescuer ---------------------------------------------------------------

    async def job_rescue_expired(self, p: RescueParams) -> list[Rescued] | None:
        """One rescuer tick. Returns None when another process holds leadership."""
        with translate():
            async with self.pool.connection() as conn, conn.transaction():
                cur = await conn.execute(QUERIES["rescuer_try_lock"], {"idle_ms": p.idle_ms})
                row = await cur.fetchone()
                if not row or not row["leader"]:
                    return None
                cur = await conn.execute(
                    QUERIES["job_rescue_expired"],
                    {
                        "max_rescues": p.max_rescues,
                        "quarantine_at": p.quarantine_at,
                        "limit": p.limit,
                    },
                )
                rows = await cur.fetchall()
                # start_by / deadline passed before the job started: dead, not run
                cur = await conn.execute(QUERIES["job_expire"], {"limit": p.limit})
                rows += await cur.fetchall()
                return [Rescued.from_row(r) for r in rows]

    async def job_prune_finished(self, p: PruneParams) -> int:
        rows = await self._all(
            "job_prune_finished",
            {"succeeded_ms": p.succeeded_ms, "failed_ms": p.failed_ms, "limit": p.limit},
        )
        return len(rows)

    async def workflow_prune_finished(self, p: PruneParams) -> int:
        """Delete finished workflows with no node left; returns how many."""
        rows = await self._all(
            "workflow_prune_finished",
            {"keep_ms": max(p.succeeded_ms, p.failed_ms), "limit": p.limit},
        )
        return len(rows)

    async def lease_refusal_record(
        self, worker: str, action: str, leases: Sequence[tuple[int, int]]
    ) -> None:
        """Record refused writes; best effort (the refusal itself already protected us)."""
        if leases:
            await self._all(
                "lease_refusal_record",
                {
                    "ids": [i for i, _ in leases],
                    "tokens": [t for _, t in leases],
                    "workers": [worker] * len(leases),
                    "actions": [action] * len(leases),
                },
            )

    async def effect_insert(self, conn: AsyncConn, job_id: int, lease_token: int) -> None:
        with translate():
            await conn.execute(
                QUERIES["effect_insert"], {"job_id": job_id, "lease_token": lease_token}
            )

    # -- the HTTP API --------------------------------------------------------------

    async def job_get_by_idempotency_key(self, key: str) -> Job | None:
        rows = await self._all("job_get_by_idempotency_key", {"idempotency_key": key})
        return Job.from_row(rows[0]) if rows else None

    async def job_get_many_by_idempotency_key(self, keys: Sequence[str]) -> list[Job]:
        """The jobs holding any of ``keys`` (one read, the unique key index)."""
        rows = await self._all("job_get_many_by_idempotency_key", {"keys": list(keys)})
        return [Job.from_row(r) for r in rows]

    async def job_insert_many_returning(
        self, jobs: Sequence[NewJob], default_max_attempts: int
    ) -> BatchInserted:
        """Insert ``jobs`` in one transaction: all of them, or none.

        A job whose idempotency key is already taken is a replay when the existing
        job was made from the same request (it is returned, ``created`` False); when
        not, the whole transaction is rolled back and its index is reported in
        ``mismatched``. Keys must be unique within ``jobs`` (the caller checks).
        """
        keys = [j.idempotency_key for j in jobs if j.idempotency_key is not None]
        deps = batch_dependencies(jobs)
        # A replayed row deleted by retention between our two statements would look
        # like a reused key; the whole transaction is tried again (then it inserts).
        for _ in range(3):
            with translate():
                async with self.pool.connection() as conn, conn.transaction():
                    verdicts = None
                    if deps:  # lock them first, as job_insert does (job_deps_lock)
                        cur = await conn.execute(QUERIES["job_deps_lock"], {"ids": deps})
                        verdicts = batch_verdicts(jobs, await cur.fetchall())
                    params = batch_params(jobs, default_max_attempts, verdicts)
                    cur = await conn.execute(QUERIES["job_insert_many_returning"], params)
                    inserted = [Job.from_row(r) for r in await cur.fetchall()]
                    existing: list[Job] = []
                    if len(inserted) < len(jobs) and keys:
                        cur = await conn.execute(
                            QUERIES["job_get_many_by_idempotency_key"], {"keys": keys}
                        )
                        existing = [Job.from_row(r) for r in await cur.fetchall()]
                    result = match_batch(jobs, inserted, existing)
                    if result.mismatched or result.vanished:
                        raise psycopg.Rollback()  # caught by conn.transaction(): rolled back
                    if deps:
                        await conn.execute(
                            QUERIES["job_deps_insert_many"], batch_edges(jobs, result)
                        )
            if not result.vanished:
                return result
        return result

    async def job_list(self, p: ListParams) -> list[Job]:
        """One page, newest first; unprepared on purpose (see the query's comment)."""
        params = {
            "state": p.state.value if p.state else None,
            "type": p.type,
            "queue": p.queue,
            "before": p.before_id,
            "limit": p.limit,
        }
        with translate():
            async with self.pool.connection() as conn:
                cur = await conn.execute(QUERIES["job_list"], params, prepare=False)
                return [Job.from_row(r) for r in await cur.fetchall()]

    async def job_cancel(self, job_id: int) -> Job | None:
        rows = await self._all("job_cancel", {"id": job_id})
        return Job.from_row(rows[0]) if rows else None

    # -- workflows -------------------------------------------------------------------

    async def workflow_insert(
        self, wf: NewWorkflow, default_max_attempts: int
    ) -> tuple[DictRow, list[Job]] | None:
        """The workflow, its nodes and its edges in one statement; None when its
        idempotency key is taken (then read :meth:`workflow_get_by_idempotency_key`)."""
        return await self._workflow_with_nodes(
            "workflow_insert", workflow_params(wf, default_max_attempts)
        )

    async def workflow_get_by_idempotency_key(self, key: str) -> tuple[DictRow, list[Job]] | None:
        return await self._workflow_with_nodes(
            "workflow_get_by_idempotency_key", {"idempotency_key": key}
        )

    async def workflow_get(self, workflow_id: int) -> tuple[DictRow, list[Job]] | None:
        return await self._workflow_with_nodes("workflow_get", {"id": workflow_id})

    async def _workflow_with_nodes(
        self, name: LiteralString, params: dict[str, Any]
    ) -> tuple[DictRow, list[Job]] | None:
        """``name`` returns (or inserts and returns) one workflow row; its nodes are read
        in the same transaction, so row and nodes are one snapshot."""
        with translate():
            async with self.pool.connection() as conn, conn.transaction():
                cur = await conn.execute(QUERIES[name], params)
                row = await cur.fetchone()
                if row is None:
                    return None
                cur = await conn.execute(QUERIES["workflow_nodes"], {"id": row["id"]})
                return row, [Job.from_row(r) for r in await cur.fetchall()]

    async def workflow_cancel(self, workflow_id: int) -> list[DictRow]:
        """Cancel the unfinished nodes; returns (id, state) of those it touched."""
        return await self._all("workflow_cancel", {"id": workflow_id})

    async def job_retry(self, job_id: int) -> Job | None:
        rows = await self._all("job_retry", {"id": job_id})
        return Job.from_row(rows[0]) if rows else None

    async def job_retry_refusal(self, job_id: int) -> str | None:
        """Why job_retry returned nothing, in words; None when there is no such job."""
        job = await self.job_get(job_id)
        if job is None:
            return None
        blocking = await self._all("job_blocking_deps", {"id": job_id})
        if job.state in (JobState.DEAD, JobState.CANCELLED) and blocking:
            names = ", ".join(f"{r['name']} ({r['state']})" for r in blocking)
            return (
                f"job {job_id} depends on {names}: retry that first; the jobs it "
                "cancelled reopen with it"
            )
        return f"job {job_id} is {job.state.value}; only dead or cancelled jobs can be retried"

    async def queue_depth_get(self, queue: str, cap: int) -> int:
        """Jobs waiting in ``queue``, counted up to ``cap`` at most."""
        rows = await self._all("queue_depth_get", {"queue": queue, "cap": cap})
        return int(rows[0]["n"])

    async def queue_list(self) -> list[DictRow]:
        return await self._all("queue_list", {})

    async def queue_set_paused(self, name: str, paused: bool) -> DictRow:
        rows = await self._all("queue_set_paused", {"name": name, "paused": paused})
        return rows[0]

    async def worker_list(self, ttl_ms: int) -> list[DictRow]:
        return await self._all("worker_list", {"ttl_ms": ttl_ms})

    async def job_counts_finished(self, cap: int = FINISHED_COUNT_CAP) -> list[DictRow]:
        """(state, n, estimated) for succeeded, dead, cancelled: exact up to ``cap``."""
        return await self._all("job_counts_finished", {"cap": cap})

    async def xmin_horizon_age(self) -> int:
        """Transactions since the oldest one still running began (see the query)."""
        rows = await self._all("xmin_horizon_age", {})
        return int(rows[0]["age"])

    # -- operating (CLI, dashboard, metrics) ---------------------------------------

    async def job_retry_dead_many(
        self, type: str | None, queue: str | None, batch: int = 1000
    ) -> list[int]:
        """Replay every dead job matching the filters (None: any), ``batch`` rows per
        transaction; returns the replayed ids. Unprepared, as job_list."""
        done: list[int] = []
        after: int | None = None
        while True:
            params = {"type": type, "queue": queue, "after": after, "limit": batch}
            with translate():
                async with self.pool.connection() as conn:
                    cur = await conn.execute(QUERIES["job_retry_dead_many"], params, prepare=False)
                    rows = await cur.fetchall()
            done += [int(r["id"]) for r in rows if r["replayed"]]
            if len(rows) < batch:
                return done
            after = int(rows[-1]["id"])

    async def throughput_recent(self, minutes: int) -> list[DictRow]:
        return await self._all("throughput_recent", {"minutes": minutes})

    async def schema_version_get(self) -> int | None:
        rows = await self._all("schema_version_get", {})
        version = rows[0]["version"] if rows else None
        return None if version is None else int(version)


# --------------------------------------------------------------------------- sync


class SyncStore:
    """Sync access on a connection the caller owns (and whose transaction it controls)."""

    def job_insert(self, conn: SyncConn, job: NewJob, default_max_attempts: int) -> Job | None:
        """With depends_on, needs a transaction (the caller's, else one of its own)."""
        if not job.depends_on:
            with translate(), conn.cursor(row_factory=dict_row) as cur:
                cur.execute(QUERIES["job_insert"], job.params(default_max_attempts))
                row = cur.fetchone()
                return Job.from_row(row) if row else None
        if conn.autocommit:
            with conn.transaction():
                return self._job_insert_with_deps(conn, job, default_max_attempts)
        # Inside the caller's transaction: theirs to commit or roll back.
        return self._job_insert_with_deps(conn, job, default_max_attempts)

    def _job_insert_with_deps(
        self, conn: SyncConn, job: NewJob, default_max_attempts: int
    ) -> Job | None:
        deps = list(job.depends_on)
        with translate(), conn.cursor(row_factory=dict_row) as cur:
            cur.execute(QUERIES["job_deps_lock"], {"ids": deps})
            pending, upstream = deps_verdict(deps, cur.fetchall())
            cur.execute(
                QUERIES["job_insert"],
                job.params(
                    default_max_attempts,
                    pending_deps=pending,
                    upstream_error=upstream,
                ),
            )
            row = cur.fetchone()
            if row is None:
                return None
            cur.execute(QUERIES["job_deps_insert"], {"job_id": row["id"], "depends_on": deps})
            return Job.from_row(row)

    def workflow_insert(
        self, conn: SyncConn, wf: NewWorkflow, default_max_attempts: int
    ) -> Workflow | None:
        """As AsyncStore.workflow_insert, on the caller's connection (and transaction)."""
        with translate(), conn.cursor(row_factory=dict_row) as cur:
            cur.execute(QUERIES["workflow_insert"], workflow_params(wf, default_max_attempts))
            row = cur.fetchone()
            return None if row is None else self._with_nodes(cur, row)

    def workflow_get(self, conn: SyncConn, workflow_id: int) -> Workflow | None:
        with translate(), conn.cursor(row_factory=dict_row) as cur:
            cur.execute(QUERIES["workflow_get"], {"id": workflow_id})
            row = cur.fetchone()
            return None if row is None else self._with_nodes(cur, row)

    def workflow_get_by_idempotency_key(self, conn: SyncConn, key: str) -> Workflow | None:
        with translate(), conn.cursor(row_factory=dict_row) as cur:
            cur.execute(QUERIES["workflow_get_by_idempotency_key"], {"idempotency_key": key})
            row = cur.fetchone()
            return None if row is None else self._with_nodes(cur, row)

    @staticmethod
    def _with_nodes(cur: psycopg.Cursor[DictRow], row: DictRow) -> Workflow:
        cur.execute(QUERIES["workflow_nodes"], {"id": row["id"]})
        return Workflow.from_rows(row, [Job.from_row(r) for r in cur.fetchall()])

    def job_get_by_idempotency_key(self, conn: SyncConn, key: str) -> Job | None:
        with translate(), conn.cursor(row_factory=dict_row) as cur:
            cur.execute(QUERIES["job_get_by_idempotency_key"], {"idempotency_key": key})
            row = cur.fetchone()
            return Job.from_row(row) if row else None

    def job_get(self, conn: SyncConn, job_id: int) -> Job | None:
        with translate(), conn.cursor(row_factory=dict_row) as cur:
            cur.execute(QUERIES["job_get"], {"id": job_id})
            row = cur.fetchone()
            return Job.from_row(row) if row else None

    def job_insert_many(
        self, conn: SyncConn, jobs: Sequence[NewJob], default_max_attempts: int
    ) -> list[int]:
        """COPY the jobs into a staging table, then move them in one INSERT.

        Must run inside a transaction (the staging table empties at commit). A batch
        in which some job has ``depends_on`` is inserted one job at a time instead
        (job_insert with its dependency locks), in the same transaction.
        """
        if batch_dependencies(jobs):
            inserted = [self._job_insert_with_deps(conn, j, default_max_attempts) for j in jobs]
            return [j.id for j in inserted if j is not None]
        with translate(), conn.cursor() as cur:
            cur.execute(QUERIES["job_stage_prepare"])
            cur.execute(QUERIES["job_stage_clear"])
            # jsonb columns as JSON text (text-format COPY): the backoff's text is made
            # once per policy rather than once per row
            with cur.copy(QUERIES["job_stage_copy"]) as copy:
                for i, job in enumerate(jobs):
                    copy.write_row(
                        (
                            i,
                            job.type,
                            job.queue,
                            job.priority,
                            json.dumps(job.payload),
                            job.max_attempts or default_max_attempts,
                            job.backoff.json_text,
                            job.timeout_ms,
                            job.run_at,
                            job.delay_ms,
                            job.idempotency_key,
                            job.request_hash() if job.idempotency_key else None,
                            job.start_by,
                            job.deadline,
                            job.heartbeat_timeout_ms,
                        )
                    )
            cur.execute(QUERIES["job_insert_staged"])
            return [int(r[0]) for r in cur.fetchall()]

    def job_finish_in(
        self, conn: SyncConn, finishes: Sequence[Finish], idle_ms: int = FINISH_IDLE_MS
    ) -> set[int]:
        """See AsyncStore.job_finish_in."""
        # tuple rows whatever the connection's row factory
        with translate(), conn.cursor(row_factory=tuple_row) as cur:
            cur.execute(QUERIES["tx_idle_limit"], {"idle_ms": idle_ms})
            cur.execute(QUERIES["job_finish_many"], finish_params(finishes))
            return {int(r[0]) for r in cur.fetchall()}

    def effect_insert(self, conn: SyncConn, job_id: int, lease_token: int) -> None:
        with translate():
            conn.execute(QUERIES["effect_insert"], {"job_id": job_id, "lease_token": lease_token})


def is_transient(exc: BaseException) -> bool:
    return isinstance(exc, DatabaseUnavailable)
