"""Each statement (or group of statements) the clients and both stores run, written
once as a :class:`~deadman.store.plan.Plan`: SyncStore, AsyncStore, ``deadman.Client``
and ``deadman.AsyncClient`` all run these, on whichever connection they hold."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import Any

from psycopg.rows import DictRow

from deadman.bounds import SCHEDULES_LISTED_MAX
from deadman.model import Job, JobState, Workflow
from deadman.store.batches import batch_dependencies
from deadman.store.jobs import NewJob, deps_verdict
from deadman.store.limits import Limit, LimitParams, limit_params, limits_of, list_params
from deadman.store.plan import Copy, Plan, Query, Refused, Rows, Steps, one
from deadman.store.schedules import Schedule, ScheduleParams, schedule_params, schedules_of
from deadman.store.workflows import NewWorkflow, workflow_params

#: The unique index a job's idempotency key is held in (migrations): a keyed COPY that
#: it refuses met a key another transaction took after the look-up (DECISIONS 92).
IDEMPOTENCY_KEY_INDEX = "jobs_idempotency_key_uq"
#: a workflow's row and its nodes, read in one transaction
WorkflowRows = tuple[DictRow, list[Job]]


def first_job(rows: Rows) -> Job | None:
    """The statement's one row as a job; None when it matched no row."""
    return Job.from_row(rows[0]) if rows else None


def jobs_of(rows: Rows) -> list[Job]:
    return [Job.from_row(r) for r in rows]


def workflow_of(found: WorkflowRows | None) -> Workflow | None:
    """A workflow plan's rows as a :class:`~deadman.model.Workflow`."""
    return None if found is None else Workflow.from_rows(*found)


def _first(rows: Rows) -> Schedule | None:
    return Schedule.from_row(rows[0]) if rows else None


# -- jobs ----------------------------------------------------------------------------


def job_insert(
    job: NewJob, default_max_attempts: int, *, handoff: bool = False
) -> Plan[Job | None]:
    """None when its idempotency key is taken (read job_get_by_idempotency_key then).
    With depends_on: the dependencies locked, the job and its edges inserted, in one
    transaction. ``handoff``: the plan runs on a connection of its own, outside any
    caller's transaction, so the job may go straight to a parked worker (DECISIONS
    83): job_insert_handoff, for a job that could be handed off at all (no
    depends_on, no limit key, not scheduled later); every other job takes the
    plainer job_insert (DECISIONS 84)."""
    return Plan(
        lambda: _job_insert(job, default_max_attempts, handoff=handoff),
        atomic=bool(job.depends_on),
    )


def _job_insert(
    job: NewJob, default_max_attempts: int, *, handoff: bool = False
) -> Steps[Job | None]:
    if not job.depends_on:
        name = "job_insert_handoff" if handoff and _may_hand_off(job) else "job_insert"
        return first_job((yield Query(name, job.params(default_max_attempts))))
    deps = list(job.depends_on)
    pending, upstream = deps_verdict(deps, (yield Query("job_deps_lock", {"ids": deps})))
    row = first_job(
        (
            yield Query(
                "job_insert",
                job.params(default_max_attempts, pending_deps=pending, upstream_error=upstream),
            )
        )
    )
    if row is not None:
        yield Query("job_deps_insert", {"job_id": row.id, "depends_on": deps})
    return row


def _may_hand_off(job: NewJob) -> bool:
    """Whether job_insert_handoff could hand ``job`` off (it checks again, with the
    parked slots, the queue and the clock): a job with a limit key is its limit's to
    start, one scheduled later is not due. (depends_on: the caller's test.)"""
    return job.limit_key is None and job.run_at is None and job.delay_ms == 0


def job_insert_many(jobs: Sequence[NewJob], default_max_attempts: int) -> Plan[list[int]]:
    """COPY the jobs into a staging table, then move them in one INSERT; the new ids in
    order (a job whose idempotency key is taken is skipped). One transaction (the
    staging table empties at commit). A batch with no key, run_at or delay in it is
    COPYed straight into the jobs table instead, under ids reserved first (DECISIONS
    68); so is one in which every job has a key of its own that no job holds yet
    (DECISIONS 92). A batch in which some job has ``depends_on`` is inserted one job
    at a time, with its dependency locks."""
    return Plan(lambda: _job_insert_many(jobs, default_max_attempts), atomic=True)


def _job_insert_many(jobs: Sequence[NewJob], default_max_attempts: int) -> Steps[list[int]]:
    if not jobs:
        return []
    if batch_dependencies(jobs):
        ids = []
        for j in jobs:
            made = yield from _job_insert(j, default_max_attempts)
            if made is not None:
                ids.append(made.id)
        return ids
    if all(_copies_direct(j) for j in jobs):
        queues = _queues(jobs)
        reserved = yield Query("job_ids_reserve", {"n": len(jobs), "queues": queues})
        ids = [int(i) for i in reserved[0]["ids"]]
        yield Copy("job_copy_direct", _direct(ids, jobs, default_max_attempts))
        return ids
    keys = _keys_direct(jobs)
    if keys is not None:
        copied = yield from _copy_keyed(jobs, keys, default_max_attempts)
        if copied is not None:
            return copied
    yield Query("job_stage_prepare", {})
    yield Query("job_stage_clear", {})
    yield Copy("job_stage_copy", _staged(jobs, default_max_attempts))
    return [int(r["id"]) for r in (yield Query("job_insert_staged", {}))]


def _copy_keyed(
    jobs: Sequence[NewJob], keys: list[str], default_max_attempts: int
) -> Steps[list[int] | None]:
    """The keyed COPY (DECISIONS 92): the new ids, or None when a key is taken, seen by
    the look-up or met by the COPY (which is then rolled back to its savepoint, the
    caller's transaction going on): the batch must be staged."""
    queues = _queues(jobs)
    lines = "\n".join(keys)
    reserved = yield Query(
        "job_ids_reserve_keyed", {"n": len(jobs), "queues": queues, "keys": lines}
    )
    if reserved[0]["taken"]:
        return None
    ids = [int(i) for i in reserved[0]["ids"]]
    rows = _direct_keyed(ids, jobs, default_max_attempts)
    try:
        yield Copy("job_copy_direct_keyed", rows, tentative=True)
    except Refused as refused:
        if refused.constraint not in (None, IDEMPOTENCY_KEY_INDEX):
            raise refused.cause from None
        return None
    return ids


def _copies_direct(job: NewJob) -> bool:
    """The job can be COPYed straight into the jobs table (DECISIONS 68): nothing in it
    needs the server's clock (its run_at, its state) or ON CONFLICT (a key)."""
    return job.idempotency_key is None and job.run_at is None and job.delay_ms == 0


def _direct(
    ids: Sequence[int], jobs: Sequence[NewJob], default_max_attempts: int
) -> Iterator[tuple[Any, ...]]:
    """job_copy_direct's rows, in job_stage_copy's encoding."""
    for id_, job in zip(ids, jobs, strict=True):
        yield (id_, *_what(job, default_max_attempts), *_bounds(job))


def _keys_direct(jobs: Sequence[NewJob]) -> list[str] | None:
    """The batch's idempotency keys if it can be COPYed straight in with them (DECISIONS
    92): every job has a key, no two the same, none with a line break (job_ids_reserve_keyed
    takes them a line each; ``Client.job`` refuses control characters in a key), and
    nothing else needs the server's clock (run_at, delay). None: the staged path (a key
    twice in one batch: its ``ON CONFLICT`` keeps the first)."""
    if any(j.idempotency_key is None or j.run_at is not None or j.delay_ms for j in jobs):
        return None
    distinct = {str(j.idempotency_key) for j in jobs}
    if len(distinct) != len(jobs) or any("\n" in k for k in distinct):
        return None
    return list(distinct)  # the look-up takes them in any order; the COPY sorts its rows


def _queues(jobs: Sequence[NewJob]) -> list[str]:
    """The batch's queues, each once, in order: what its reservation wakes."""
    return sorted({j.queue for j in jobs})


def _direct_keyed(
    ids: Sequence[int], jobs: Sequence[NewJob], default_max_attempts: int
) -> Iterator[tuple[Any, ...]]:
    """job_copy_direct_keyed's rows, in key order (each job keeps the id reserved for
    its place in the batch)."""
    for id_, job in sorted(zip(ids, jobs, strict=True), key=lambda p: str(p[1].idempotency_key)):
        what = _what(job, default_max_attempts)
        yield (id_, *what, job.idempotency_key, job.request_hash(), *_bounds(job))


def _staged(jobs: Sequence[NewJob], default_max_attempts: int) -> Iterator[tuple[Any, ...]]:
    """job_stage_copy's rows: jsonb columns as JSON text (text-format COPY), the
    backoff's text made once per policy rather than once per row."""
    for i, job in enumerate(jobs):
        key = job.idempotency_key
        when = (job.run_at, job.delay_ms, key, job.request_hash() if key else None)
        yield (i, *_what(job, default_max_attempts), *when, *_bounds(job))


def _what(job: NewJob, default_max_attempts: int) -> tuple[Any, ...]:
    """type, queue, priority, payload, max_attempts, backoff, timeout_ms, as COPY text."""
    payload = "null" if job.payload is None else json.dumps(job.payload)
    return (
        job.type,
        job.queue,
        job.priority,
        payload,
        job.max_attempts or default_max_attempts,
        job.backoff.json_text,
        job.timeout_ms,
    )


def _bounds(job: NewJob) -> tuple[Any, ...]:
    """start_by, deadline, heartbeat_timeout_ms, limit_key, trace_context."""
    trace = None if job.trace_context is None else json.dumps(job.trace_context)
    return (job.start_by, job.deadline, job.heartbeat_timeout_ms, job.limit_key, trace)


def job_get(job_id: int) -> Plan[Job | None]:
    return one(Query("job_get", {"id": job_id}), first_job)


def job_get_by_idempotency_key(key: str) -> Plan[Job | None]:
    return one(Query("job_get_by_idempotency_key", {"idempotency_key": key}), first_job)


def job_cancel(job_id: int) -> Plan[Job | None]:
    """None: no such job, or it already finished."""
    return one(Query("job_cancel", {"id": job_id}), first_job)


def job_retry(job_id: int) -> Plan[Job | None]:
    """None: refused (see :func:`job_retry_refusal`)."""
    return one(Query("job_retry", {"id": job_id}), first_job)


def job_retry_refusal(job_id: int) -> Plan[str | None]:
    """Why job_retry returned nothing, in words; None when there is no such job."""
    return Plan(lambda: _job_retry_refusal(job_id))


def _job_retry_refusal(job_id: int) -> Steps[str | None]:
    job = first_job((yield Query("job_get", {"id": job_id})))
    if job is None:
        return None
    blocking = yield Query("job_blocking_deps", {"id": job_id})
    if job.state in (JobState.DEAD, JobState.CANCELLED) and blocking:
        names = ", ".join(f"{r['name']} ({r['state']})" for r in blocking)
        return (
            f"job {job_id} depends on {names}: retry that first; the jobs it "
            "cancelled reopen with it"
        )
    return f"job {job_id} is {job.state.value}; only dead or cancelled jobs can be retried"


# -- workflows -----------------------------------------------------------------------


def workflow_insert(wf: NewWorkflow, default_max_attempts: int) -> Plan[WorkflowRows | None]:
    """The workflow, its nodes and its edges in one statement; None when its
    idempotency key is taken (then read :func:`workflow_get_by_idempotency_key`)."""
    return _workflow_with_nodes(Query("workflow_insert", workflow_params(wf, default_max_attempts)))


def workflow_get(workflow_id: int) -> Plan[WorkflowRows | None]:
    return _workflow_with_nodes(Query("workflow_get", {"id": workflow_id}))


def workflow_get_by_idempotency_key(key: str) -> Plan[WorkflowRows | None]:
    return _workflow_with_nodes(Query("workflow_get_by_idempotency_key", {"idempotency_key": key}))


def _workflow_with_nodes(query: Query) -> Plan[WorkflowRows | None]:
    """``query`` returns (or inserts and returns) one workflow row; its nodes are read
    in the same transaction, so row and nodes are one snapshot."""

    def steps() -> Steps[WorkflowRows | None]:
        rows = yield query
        if not rows:
            return None
        return rows[0], jobs_of((yield Query("workflow_nodes", {"id": rows[0]["id"]})))

    return Plan(steps, atomic=True)


# -- limits and schedules --------------------------------------------------------------


def limit_put(p: LimitParams) -> Plan[Limit]:
    return one(Query("limit_put", limit_params(p)), lambda rows: limits_of(rows)[0])


def limit_list() -> Plan[list[Limit]]:
    return one(Query("limit_list", list_params()), limits_of)


def limit_get(key: str) -> Plan[Limit | None]:
    return one(Query("limit_get", {"key": key}), lambda rows: next(iter(limits_of(rows)), None))


def limit_delete(key: str) -> Plan[bool]:
    return one(Query("limit_delete", {"key": key}), bool)


def db_now() -> Plan[datetime]:
    return one(Query("db_now", {}), lambda rows: rows[0]["now"])


def schedule_put(p: ScheduleParams) -> Plan[Schedule]:
    return one(Query("schedule_put", schedule_params(p)), lambda rows: schedules_of(rows)[0])


def schedule_list() -> Plan[list[Schedule]]:
    return one(Query("schedule_list", {"cap": SCHEDULES_LISTED_MAX}), schedules_of)


def schedule_get(name: str) -> Plan[Schedule | None]:
    return one(Query("schedule_get", {"name": name}), _first)


def schedule_delete(name: str) -> Plan[bool]:
    return one(Query("schedule_delete", {"name": name}), bool)


def schedule_set_paused(name: str, paused: bool) -> Plan[Schedule | None]:
    return one(Query("schedule_set_paused", {"name": name, "paused": paused}), _first)


def server_identity() -> Plan[tuple[str, datetime]]:
    """(database, postmaster start time): which database a connection reaches."""
    return one(
        Query("server_identity", {}), lambda rows: (rows[0]["database"], rows[0]["started_at"])
    )
