"""The clients' job and workflow calls, each written once (bound to both clients by
``surface``): enqueue, submit, enqueue_many, workflow, get, get_workflow, cancel,
retry. ``conn=`` on any of them runs it on the caller's connection, inside their
transaction (see :mod:`deadman.connections` for what it takes)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol, TypeVar, Unpack

from deadman.clientcore.core import Call, Core
from deadman.clientcore.options import JobOptions, traced
from deadman.connections import Joinable
from deadman.errors import Conflict, DuplicateKey, NotFound
from deadman.model import Job, Workflow
from deadman.spec import BatchJobSpec, JobSpec, validate
from deadman.store import NewJob, NewWorkflow, plans
from deadman.store.plan import Plan, Steps, then


def enqueue(
    client: Core,
    type: str,
    payload: Any = None,
    *,
    conn: Joinable | None = None,
    **options: Unpack[JobOptions],
) -> Call[Job]:
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
    return Call(_enqueued(client.job(type, payload, **options), client, own=conn is None), conn)


def submit(
    client: Core,
    spec: JobSpec,
    *,
    idempotency_key: str | None = None,
    conn: Joinable | None = None,
) -> Call[Job]:
    """Enqueue a job given as a :class:`deadman.JobSpec` (e.g. a FastAPI request
    body), as :meth:`enqueue` does."""
    body = spec.model_dump(exclude_unset=True, by_alias=True)
    if idempotency_key is not None:
        body["idempotency_key"] = idempotency_key
    made = traced(validate(BatchJobSpec, body).to_new_job())
    return Call(_enqueued(made, client, own=conn is None), conn)


def enqueue_many(
    client: Core, jobs: Iterable[NewJob], *, conn: Joinable | None = None
) -> Call[list[int]]:
    """Enqueue many jobs (built with :meth:`job`) with COPY in one transaction; returns
    the new ids in order. Inside ``conn``'s transaction when given, theirs to commit.

    Jobs whose idempotency key already exists are skipped (their ids are not in
    the result).
    """
    return Call(plans.job_insert_many(list(jobs), client.settings.max_attempts), conn)


def workflow(
    client: Core,
    name: str,
    nodes: Mapping[str, NewJob],
    edges: Iterable[tuple[str, str]] = (),
    *,
    idempotency_key: str | None = None,
    conn: Joinable | None = None,
) -> Call[Workflow]:
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
    made = then(plans.workflow_insert(wf, client.settings.max_attempts), plans.workflow_of)
    return Call(_keyed(wf, made, _workflow_by_key), conn)


def _workflow_by_key(key: str) -> Plan[Workflow | None]:
    return then(plans.workflow_get_by_idempotency_key(key), plans.workflow_of)


def get(client: Core, job_id: int, *, conn: Joinable | None = None) -> Call[Job | None]:
    """The job, or None."""
    return Call(plans.job_get(job_id), conn)


def get_workflow(
    client: Core, workflow_id: int, *, conn: Joinable | None = None
) -> Call[Workflow | None]:
    """The workflow and its nodes (read in one transaction), or None."""
    return Call(then(plans.workflow_get(workflow_id), plans.workflow_of), conn)


def cancel(client: Core, job_id: int, *, conn: Joinable | None = None) -> Call[Job]:
    """Cancel a job, as ``POST /jobs/{id}/cancel``: one not running yet ends cancelled
    at once; a running one comes back still running with ``cancel_requested`` (its
    worker cancels the handler, and the job ends cancelled). Its waiting dependents
    are cancelled with it. :class:`~deadman.errors.NotFound` for an unknown id,
    :class:`~deadman.errors.Conflict` when it already finished."""
    return Call(_acted(job_id, plans.job_cancel(job_id), _cancel_refusal(job_id)), conn)


def retry(client: Core, job_id: int, *, conn: Joinable | None = None) -> Call[Job]:
    """Retry a dead or cancelled job, as ``POST /jobs/{id}/retry``: back to queued (to
    waiting while a dependency is unfinished) with a fresh set of attempts.
    :class:`~deadman.errors.NotFound` for an unknown id; refused with
    :class:`~deadman.errors.Conflict` saying why: its state, or a dependency that is
    dead or cancelled (retry that one first)."""
    return Call(_acted(job_id, plans.job_retry(job_id), plans.job_retry_refusal(job_id)), conn)


def _cancel_refusal(job_id: int) -> Plan[str | None]:
    """Why job_cancel changed nothing (the API's words); None: no such job."""

    def why(current: Job | None) -> str | None:
        if current is None:
            return None
        return f"job {job_id} already finished ({current.state.value}); nothing to cancel"

    return then(plans.job_get(job_id), why)


def _acted(job_id: int, action: Plan[Job | None], refusal: Plan[str | None]) -> Plan[Job]:
    """The job ``action`` changed; else NotFound, or Conflict with the reason, read
    after the action found nothing to do (never before it), as the API does."""

    def steps() -> Steps[Job]:
        job = yield from action.steps()
        if job is not None:
            return job
        reason = yield from refusal.steps()
        if reason is None:
            raise NotFound(f"no job {job_id}")
        raise Conflict(reason)

    return Plan(steps)


def _enqueued(new: NewJob, client: Core, *, own: bool) -> Plan[Job]:
    """Insert ``new``; when its idempotency key is taken, the job that holds it.
    ``own``: on the client's own connection (not in a caller's transaction), where a
    parked worker may be handed the job (DECISIONS 83)."""
    made = plans.job_insert(new, client.settings.max_attempts, handoff=own)
    return _keyed(new, made, plans.job_get_by_idempotency_key)


def _keyed(
    request: NewJob | NewWorkflow, insert: Plan[K | None], by_key: Callable[[str], Plan[K | None]]
) -> Plan[K]:
    """``insert``; when it made nothing (its idempotency key is taken), the row that
    holds the key if it was made from the same request (a replay), else
    :class:`DuplicateKey`. As atomic as ``insert``."""

    def steps() -> Steps[K]:
        made = yield from insert.steps()
        if made is not None:
            return made
        key = request.idempotency_key
        assert key is not None  # an insert makes nothing only on a key conflict
        return _replay(request, (yield from by_key(key).steps()))

    return Plan(steps, insert.atomic)


class _Keyed(Protocol):
    @property
    def id(self) -> int: ...

    @property
    def request_hash(self) -> str | None: ...


K = TypeVar("K", bound=_Keyed)


def _replay(request: NewJob | NewWorkflow, existing: K | None) -> K:
    """The row a taken key already made, if it was made from the same request."""
    key = request.idempotency_key
    what = "job" if isinstance(request, NewJob) else "workflow"
    if existing is None:  # pragma: no cover - the row was pruned in between
        raise DuplicateKey(f"idempotency key {key!r} is in use")
    if existing.request_hash != request.request_hash():
        raise DuplicateKey(
            f"idempotency key {key!r} was used for a different {what} request "
            f"({what} {existing.id})"
        )
    return existing
