"""Job states, the one transition table, the Job record and backoff policies.

The table below is the law: the store's queries only ever perform moves listed
here, and ``tests/unit/test_model.py`` checks every pair of states against it.
"""

from __future__ import annotations

import enum
import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from deadman.bounds import NAME_RE, NAME_RULE
from deadman.errors import IllegalTransition, InvalidJob


class JobState(enum.StrEnum):
    WAITING = "waiting"
    SCHEDULED = "scheduled"
    QUEUED = "queued"
    RUNNING = "running"
    RETRYING = "retrying"
    SUCCEEDED = "succeeded"
    DEAD = "dead"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL


S = JobState
TERMINAL: frozenset[JobState] = frozenset({S.SUCCEEDED, S.DEAD, S.CANCELLED})
#: States a worker may claim from once ``run_at <= now()``. Claiming a due
#: ``scheduled`` or ``retrying`` job is its promotion; no separate scheduler pass.
CLAIMABLE: frozenset[JobState] = frozenset({S.QUEUED, S.SCHEDULED, S.RETRYING})

TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    # Every not-yet-started state may also go to dead: start_by or deadline passed
    # before the job could start (the rescuer's job_expire), without running.
    # waiting: dependencies not finished yet (workflows, depends_on)
    S.WAITING: frozenset({S.QUEUED, S.SCHEDULED, S.CANCELLED, S.DEAD}),
    # scheduled: run_at in the future; claimed directly once due
    S.SCHEDULED: frozenset({S.QUEUED, S.RUNNING, S.CANCELLED, S.DEAD}),
    S.QUEUED: frozenset({S.RUNNING, S.CANCELLED, S.DEAD}),
    S.RUNNING: frozenset(
        {
            S.SUCCEEDED,  # handler returned (fenced)
            S.RETRYING,  # handler raised, attempts left
            S.DEAD,  # attempts exhausted, or rescued too often (poison pill)
            S.QUEUED,  # lease expired and rescued, or released on shutdown
            S.CANCELLED,  # cooperative cancel
        }
    ),
    S.RETRYING: frozenset({S.QUEUED, S.RUNNING, S.CANCELLED, S.DEAD}),
    S.SUCCEEDED: frozenset(),
    # dead-letter replay and manual retry; to waiting while dependencies are unfinished
    # (a retried job, or the upstream-cancelled jobs below it, which reopen with it)
    S.DEAD: frozenset({S.QUEUED, S.WAITING}),
    S.CANCELLED: frozenset({S.QUEUED, S.WAITING}),
}


def can_transition(src: JobState, dst: JobState) -> bool:
    return dst in TRANSITIONS[src]


def check_transition(src: JobState, dst: JobState) -> None:
    if not can_transition(src, dst):
        raise IllegalTransition(f"a job cannot move from {src.value} to {dst.value}")


def find_cycle(nodes: Sequence[str], edges: Sequence[tuple[str, str]]) -> list[str]:
    """A cycle among ``edges`` (from, to) as a list of node names that starts and ends
    with the same node, or [] for a DAG. Iterative DFS: deep chains cost no stack."""
    out: dict[str, list[str]] = {n: [] for n in nodes}
    for src, dst in edges:
        out[src].append(dst)
    colour = dict.fromkeys(nodes, 0)  # 0 new, 1 on the current path, 2 done
    for root in nodes:
        if colour[root]:
            continue
        path: list[str] = [root]
        iters = [iter(out[root])]
        colour[root] = 1
        while iters:
            nxt = next(iters[-1], None)
            if nxt is None:
                colour[path.pop()] = 2
                iters.pop()
            elif colour[nxt] == 1:
                return [*path[path.index(nxt) :], nxt]
            elif colour[nxt] == 0:
                colour[nxt] = 1
                path.append(nxt)
                iters.append(iter(out[nxt]))
    return []


class AttemptOutcome(enum.StrEnum):
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    LEASE_EXPIRED = "lease_expired"
    RELEASED = "released"
    CANCELLED = "cancelled"
    TIMED_OUT = "timed_out"


TYPE_RE = NAME_RE
QUEUE_RE = NAME_RE


def validate_type(name: str) -> str:
    """A job type given as a filter or a handler name (the spec checks submitted jobs)."""
    if not NAME_RE.fullmatch(name):
        raise InvalidJob(f"job type {name!r} {NAME_RULE}")
    return name


def validate_queue(name: str) -> str:
    if not NAME_RE.fullmatch(name):
        raise InvalidJob(f"queue {name!r} {NAME_RULE}")
    return name


@dataclass(frozen=True)
class Backoff:
    """When to try again after a failed attempt.

    ``exponential``: ``base_ms * 2**(attempt-1)`` capped at ``max_ms``; with ``full``
    jitter the delay is uniform in ``[0, that]`` (AWS's "full jitter": retries of
    many jobs that failed together spread out instead of stampeding back at once).
    ``fixed``: ``base_ms`` every time (jitter still applies if asked for).

    Checked where it comes in (``deadman.spec.BackoffSpec``: HTTP, ``Client``, CLI);
    read back from the database as it was stored.
    """

    strategy: Literal["exponential", "fixed"] = "exponential"
    base_ms: int = 1000
    max_ms: int = 300_000
    jitter: Literal["full", "none"] = "full"

    def ceiling_ms(self, attempt: int) -> int:
        """The largest delay after failed attempt number ``attempt`` (1-based)."""
        if self.strategy == "fixed":
            return self.base_ms
        exp = min(max(attempt - 1, 0), 62)
        return min(self.max_ms, self.base_ms * (1 << exp))

    def delay_ms(self, attempt: int, rng: random.Random | None = None) -> int:
        ceiling = self.ceiling_ms(attempt)
        if self.jitter == "none":
            return ceiling
        return (rng or random).randint(0, ceiling)

    def to_json(self) -> dict[str, Any]:
        return {
            "strategy": self.strategy,
            "base_ms": self.base_ms,
            "max_ms": self.max_ms,
            "jitter": self.jitter,
        }

    def stored(self) -> dict[str, Any]:
        """What the jobs table stores: only the fields that differ from the defaults, so
        the common policy is ``{}``, the column's own default (:meth:`from_json` reads
        either form back to the same policy). Written out, the default policy was 96 of
        a job row's 251 bytes, and every claim and every finish writes the row again
        (DECISIONS 77). The defaults are thereby part of the stored format: changing one
        needs a migration that writes it into the rows that left it out."""
        return {k: v for k, v in self.to_json().items() if v != _DEFAULT_FIELDS[k]}

    @property
    def json_text(self) -> str:
        """stored() as JSON text, made once per policy (equal policies share it: bulk
        enqueue writes it for every row)."""
        text = _BACKOFF_TEXT.get(self)
        if text is None:
            text = json.dumps(self.stored())
            if len(_BACKOFF_TEXT) < 1024:
                _BACKOFF_TEXT[self] = text
        return text

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> Backoff:
        if not data:
            return DEFAULT_BACKOFF
        key = (
            data.get("strategy", "exponential"),
            int(data.get("base_ms", 1000)),
            int(data.get("max_ms", 300_000)),
            data.get("jitter", "full"),
        )
        # Every claimed job carries its policy; most share a handful (frozen: safe
        # to share). Bounded, so odd policies cannot grow it without limit.
        found = _BACKOFFS.get(key)
        if found is None:
            found = cls(strategy=key[0], base_ms=key[1], max_ms=key[2], jitter=key[3])
            if len(_BACKOFFS) < 1024:
                _BACKOFFS[key] = found
        return found


DEFAULT_BACKOFF = Backoff()
_DEFAULT_FIELDS = DEFAULT_BACKOFF.to_json()
_BACKOFFS: dict[tuple[Any, ...], Backoff] = {}
_BACKOFF_TEXT: dict[Backoff, str] = {}
#: JobState by value: a dict lookup instead of the Enum constructor (per claimed job)
_STATES: dict[str, JobState] = {s.value: s for s in JobState}


@dataclass(frozen=True)
class Lease:
    worker: str
    token: int
    expires_at: datetime


@dataclass(frozen=True)
class Job:
    """A job row as the code sees it."""

    id: int
    type: str
    queue: str
    priority: int
    payload: Any
    state: JobState
    attempt: int
    max_attempts: int
    rescues: int
    backoff: Backoff
    timeout_ms: int | None
    run_at: datetime
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    idempotency_key: str | None
    lease: Lease | None
    last_error: str | None
    result: Any
    cancel_requested: bool = False
    request_hash: str | None = None
    #: the workflow this job is a node of, and the node's name in it
    workflow_id: int | None = None
    node: str | None = None
    #: dependencies not yet succeeded (a 'waiting' job)
    pending_deps: int = 0
    #: schedule-to-start: not started by then, the job ends dead ('expired')
    start_by: datetime | None = None
    #: total across retries: no attempt starts after it ('deadline')
    deadline: datetime | None = None
    #: a handler that stops calling ctx.heartbeat() for this long is hung
    heartbeat_timeout_ms: int | None = None
    #: the flow-control key (a limit on it bounds this job's starts)
    limit_key: str | None = None
    #: the enqueuer's W3C trace context (deadman.tracing), as stored: a row written by
    #: hand may hold anything, so the worker checks it again before it links to it
    trace_context: dict[str, str] | None = None

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Job:
        """The job a row of deadman.jobs describes (as the reads and listings return
        them), through the same :class:`JobReader` the claims use."""
        return reader_for(tuple(row))(tuple(row.values()))


#: The columns of deadman.jobs a Job is made from, in JobReader's order; the first
#: nine must be in every row read (the others may be left out: None, or their
#: default).
JOB_COLUMNS = (
    "id", "type", "queue", "priority", "state", "attempt", "max_attempts", "run_at",
    "created_at",
    "payload", "rescues", "backoff", "timeout_ms", "started_at", "finished_at",
    "idempotency_key", "lease_token", "lease_worker", "lease_expires_at", "last_error",
    "result", "cancel_requested", "request_hash", "workflow_id", "node", "pending_deps",
    "start_by", "deadline", "heartbeat_timeout_ms", "limit_key", "trace_context",
)  # fmt: skip
_REQUIRED = 9


class JobReader:
    """Jobs from rows of deadman.jobs given as sequences of values, for one shape of
    result (``names``: its columns, in order, as the cursor describes them): where
    each column is, looked up once per result rather than once per row. Every job a
    worker claims goes through here (a tuple per row, no dict: DECISIONS 80), so the
    instance's ``__dict__`` is filled in one step rather than through the frozen
    dataclass's ``__init__`` (one ``object.__setattr__`` per field: 30 of them); the
    result is the same frozen, comparable object, checked field for field against
    ``__init__`` by tests/unit/test_model.py. A required column missing from
    ``names`` is a KeyError here, as it was reading the row."""

    __slots__ = ("_at", "_pad")

    def __init__(self, names: Sequence[str]) -> None:
        at = {name: i for i, name in enumerate(names)}
        for name in JOB_COLUMNS[:_REQUIRED]:
            if name not in at:
                raise KeyError(name)
        # A column left out reads the None appended after the row's own values.
        self._pad = any(name not in at for name in JOB_COLUMNS)
        absent = len(names)
        self._at = tuple(at.get(name, absent) for name in JOB_COLUMNS)

    def __call__(self, values: Sequence[Any]) -> Job:
        v = (*values, None) if self._pad else values
        (i_id, i_type, i_queue, i_priority, i_state, i_attempt, i_max_attempts, i_run_at,
         i_created_at, i_payload, i_rescues, i_backoff, i_timeout_ms, i_started_at,
         i_finished_at, i_key, i_token, i_worker, i_expires, i_last_error, i_result,
         i_cancel, i_hash, i_workflow, i_node, i_deps, i_start_by, i_deadline,
         i_heartbeat, i_limit_key, i_trace) = self._at  # fmt: skip
        token = v[i_token]
        lease = None if token is None else Lease(v[i_worker] or "", int(token), v[i_expires])
        workflow_id = v[i_workflow]
        job = object.__new__(Job)
        job.__dict__.update(
            id=int(v[i_id]),
            type=v[i_type],
            queue=v[i_queue],
            priority=int(v[i_priority]),
            payload=v[i_payload],
            state=_STATES[v[i_state]],
            attempt=int(v[i_attempt]),
            max_attempts=int(v[i_max_attempts]),
            rescues=int(v[i_rescues] or 0),
            backoff=Backoff.from_json(v[i_backoff]),
            timeout_ms=v[i_timeout_ms],
            run_at=v[i_run_at],
            created_at=v[i_created_at],
            started_at=v[i_started_at],
            finished_at=v[i_finished_at],
            idempotency_key=v[i_key],
            lease=lease,
            last_error=v[i_last_error],
            result=v[i_result],
            cancel_requested=bool(v[i_cancel] or False),
            request_hash=v[i_hash],
            workflow_id=None if workflow_id is None else int(workflow_id),
            node=v[i_node],
            pending_deps=int(v[i_deps] or 0),
            start_by=v[i_start_by],
            deadline=v[i_deadline],
            heartbeat_timeout_ms=v[i_heartbeat],
            limit_key=v[i_limit_key],
            trace_context=v[i_trace],
        )
        return job


_READERS: dict[tuple[str, ...], JobReader] = {}


def reader_for(names: tuple[str, ...]) -> JobReader:
    """The JobReader of rows with these columns, made once per shape (a handful:
    the statements' RETURNING lists; bounded all the same)."""
    found = _READERS.get(names)
    if found is None:
        found = JobReader(names)
        if len(_READERS) < 256:
            _READERS[names] = found
    return found


class WorkflowState(enum.StrEnum):
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


@dataclass(frozen=True)
class Workflow:
    """A workflow row and its nodes by name, as ``Client.workflow`` returns them."""

    id: int
    name: str
    state: WorkflowState
    created_at: datetime
    finished_at: datetime | None
    nodes: dict[str, Job]
    idempotency_key: str | None = None
    request_hash: str | None = None

    @classmethod
    def from_rows(cls, row: dict[str, Any], nodes: Sequence[Job]) -> Workflow:
        return cls(
            id=int(row["id"]),
            name=row["name"],
            state=WorkflowState(row["state"]),
            created_at=row["created_at"],
            finished_at=row["finished_at"],
            nodes={j.node or str(j.id): j for j in nodes},
            idempotency_key=row.get("idempotency_key"),
            request_hash=row.get("request_hash"),
        )
