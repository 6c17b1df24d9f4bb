"""The job endpoints: submit (one or a batch), read, list, attempts, cancel, retry."""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import replace

from starlette.datastructures import QueryParams
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from deadman import tracing
from deadman.api import schema
from deadman.api.idempotency import submit, submit_batch
from deadman.api.limits import check_queue_depth
from deadman.api.problems import Problem, validation
from deadman.api.serialize import attempt_json, job_json
from deadman.api.state import api_state
from deadman.bounds import WAIT_MS_MAX
from deadman.errors import NotFound
from deadman.model import Job, JobState
from deadman.store import NewJob, UnknownDependency
from deadman.waiting import WaiterClosed, WaitTimeout


async def create_job(request: Request) -> Response:
    """201 and the new job, or 200 + ``Idempotent-Replayed`` for a replay.

    201 is sent only after the insert committed (autocommit, synchronous_commit on):
    an acknowledged job survives any crash that follows. Concurrent requests share
    one insert and its commit (deadman.api.group_commit); each is answered after it.
    """
    state = api_state(request)
    key = schema.parse_idempotency_key(request.headers.get("idempotency-key"))
    new = schema.parse_new_job(await schema.read_json(request), idempotency_key=key)
    [new] = traced(request, [new])
    await check_queue_depth(state.store, state.settings.max_queue_depth, [new])
    try:
        done = await submit(state.store, new, state.submitter.insert)
    except UnknownDependency as exc:
        raise validation([{"field": "depends_on", "message": str(exc)}]) from None
    headers = {"Location": f"/jobs/{done.job.id}"}
    if done.replayed:
        headers["Idempotent-Replayed"] = "true"
    return JSONResponse(job_json(done.job), 200 if done.replayed else 201, headers=headers)


async def create_jobs(request: Request) -> Response:
    """All jobs in one transaction, or none. 201 if any job was created; 200 with
    ``Idempotent-Replayed: true`` if every job was a replay (a whole batch resent)."""
    state = api_state(request)
    if request.headers.get("idempotency-key") is not None:
        raise validation(
            [
                {
                    "field": "Idempotency-Key",
                    "message": "not used on /jobs/batch: give each job an idempotency_key",
                }
            ]
        )
    jobs = traced(request, schema.parse_batch(await schema.read_json(request)))
    await check_queue_depth(state.store, state.settings.max_queue_depth, jobs)
    try:
        done = await submit_batch(state.store, jobs, state.settings.max_attempts)
    except UnknownDependency as exc:
        field = "depends_on" if exc.index is None else f"jobs[{exc.index}].depends_on"
        raise validation([{"field": field, "message": str(exc)}]) from None
    replayed = all(d.replayed for d in done)
    headers = {"Idempotent-Replayed": "true"} if replayed else {}
    body = {"jobs": [job_json(d.job) for d in done]}
    return JSONResponse(body, 200 if replayed else 201, headers=headers)


def traced(request: Request, jobs: list[NewJob]) -> list[NewJob]:
    """The jobs with the request's W3C trace context (``traceparent`` and
    ``tracestate`` headers, checked by deadman.tracing.carrier: a malformed one is
    ignored, the jobs are enqueued without it), so their run spans link to the
    caller's trace; as they were when there is none."""
    headers = request.headers
    found = tracing.carrier(headers.getlist("traceparent"), headers.getlist("tracestate"))
    return jobs if found is None else [replace(j, trace_context=found) for j in jobs]


async def get_job(request: Request) -> Response:
    """The job; with ``wait_ms=N`` a long-poll: answered as soon as the job has ended,
    or after N ms with the job as it is then. 200 either way (its ``state`` says which);
    no pool connection is held while it waits (deadman.waiting)."""
    job_id = schema.parse_job_id(request.path_params["id"])
    wait_ms = parse_wait_ms(request.query_params)
    state = api_state(request)
    job: Job | None = None
    if wait_ms:
        # not ended in time, gone, or the server is stopping: the job as it is now
        with contextlib.suppress(WaitTimeout, NotFound, WaiterClosed):
            job = await state.waiter.wait(job_id, wait_ms / 1000)
    if job is None:  # not waited for, still unfinished (read again: as it is now), or gone
        job = await state.store.job_get(job_id)
    if job is None:
        raise Problem("not-found", f"no job {job_id}")
    return JSONResponse(job_json(job))


def parse_wait_ms(query: QueryParams) -> int:
    """``wait_ms``: 0 (the default: no wait) to WAIT_MS_MAX, once; else 422 naming it."""
    given = query.getlist("wait_ms")
    if not given:
        return 0
    wait_ms = schema.ascii_int(given[0], 0, WAIT_MS_MAX) if len(given) == 1 else None
    if wait_ms is None:
        rule = f"must be an integer from 0 to {WAIT_MS_MAX}, given at most once"
        raise validation([{"field": "wait_ms", "message": rule}])
    return wait_ms


async def get_attempts(request: Request) -> Response:
    """The ended attempts, oldest first; a running attempt is on the job itself."""
    store = api_state(request).store
    job_id = schema.parse_job_id(request.path_params["id"])
    if await store.job_get(job_id) is None:
        raise Problem("not-found", f"no job {job_id}")
    rows = await store.job_attempts(job_id)
    return JSONResponse({"attempts": [attempt_json(r) for r in rows]})


async def list_jobs(request: Request) -> Response:
    """Newest first. ``next_cursor`` is null on the last page; a page filtered by queue
    or type may be short (even empty) and still have one (deadman.store.reads)."""
    params = schema.parse_list_query(request.query_params)
    page = await api_state(request).store.job_list(params)
    next_cursor = None if page.next_before is None else str(page.next_before)
    return JSONResponse({"jobs": [job_json(j) for j in page.jobs], "next_cursor": next_cursor})


async def cancel_job(request: Request) -> Response:
    """200 cancelled at once; 202 running, cancellation requested; 409 finished."""
    store = api_state(request).store
    job_id = schema.parse_job_id(request.path_params["id"])

    async def refusal() -> str | None:
        current = await store.job_get(job_id)
        if current is None:
            return None
        return f"job {job_id} already finished ({current.state.value}); nothing to cancel"

    job = await _acted(await store.job_cancel(job_id), job_id, refusal)
    return JSONResponse(job_json(job), 202 if job.state is JobState.RUNNING else 200)


async def retry_job(request: Request) -> Response:
    """A dead or cancelled job back to queued (waiting, while dependencies are
    unfinished) with a fresh set of attempts; 409 for other states or while a
    dependency is dead or cancelled."""
    store = api_state(request).store
    job_id = schema.parse_job_id(request.path_params["id"])
    job = await _acted(
        await store.job_retry(job_id), job_id, lambda: store.job_retry_refusal(job_id)
    )
    return JSONResponse(job_json(job))


async def _acted(job: Job | None, job_id: int, refusal: Callable[[], Awaitable[str | None]]) -> Job:
    """The job an action changed; else 404, or 409 with the reason (None: no such job).
    The reason is read after the action found nothing to do, never before it."""
    if job is not None:
        return job
    reason = await refusal()
    if reason is None:
        raise Problem("not-found", f"no job {job_id}")
    raise Problem("conflict", reason)


async def jobs(request: Request) -> Response:
    """One route for both methods of /jobs, so that a 405 there lists both in Allow."""
    if request.method == "POST":
        return await create_job(request)
    return await list_jobs(request)


ROUTES = [
    Route("/jobs", jobs, methods=["GET", "POST"]),
    # before /jobs/{id}, so that POST /jobs/batch is not taken for a job id
    Route("/jobs/batch", create_jobs, methods=["POST"]),
    Route("/jobs/{id}", get_job, methods=["GET"]),
    Route("/jobs/{id}/attempts", get_attempts, methods=["GET"]),
    Route("/jobs/{id}/cancel", cancel_job, methods=["POST"]),
    Route("/jobs/{id}/retry", retry_job, methods=["POST"]),
]
