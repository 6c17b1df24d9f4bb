"""The dashboard's GET pages: queues, jobs, dead letters, one job, workers.

Each page reads the same store methods as the JSON API and hands plain values to
its template. Every page stays fast on a table of millions of jobs: listings are
keyset-paginated (``before=<id>``) along the indexes of job_list, queue counts read
only unfinished rows, finished totals stop at a cap and are shown as estimates
beyond it (marked "~").
"""

from __future__ import annotations

from collections.abc import Callable

from starlette.requests import Request
from starlette.responses import Response

from deadman import bounds
from deadman.api.routes_ops import LIVE_STATES, queue_json, stats_json
from deadman.api.schema import parse_id
from deadman.api.serialize import (
    attempt_json,
    job_json,
    limit_json,
    schedule_json,
    worker_json,
)
from deadman.api.state import api_state
from deadman.api.ui.display import SPARK_MINUTES, shorten, spark, url
from deadman.api.ui.guard import PageError, guarded
from deadman.api.ui.render import message, page
from deadman.errors import InvalidJob
from deadman.model import JobState, validate_queue, validate_type
from deadman.store import ListParams
from deadman.store.reads import throughput_series

PAGE_SIZE = 50
STATES = [s.value for s in JobState]


def path_id(request: Request) -> int:
    """The job id of the path; a 404 page when it cannot be one (no job has it)."""
    raw = str(request.path_params["id"])
    job_id = parse_id(raw)
    if job_id is None:
        raise PageError(404, "not found", f"no job {shorten(raw)}")
    return job_id


def _filter(request: Request, name: str, check: Callable[[str], str]) -> str | None:
    """A type or queue filter; one that no job can match is ignored."""
    value = request.query_params.get(name) or None
    if value is None:
        return None
    try:
        return check(value)
    except InvalidJob:
        return None


def _before(request: Request) -> int | None:
    """The page cursor: absent, or a job id (as the "older" link writes it); anything
    else is a 400 page, not the first page passed off as the one asked for."""
    raw = request.query_params.get("before") or None
    if raw is None:
        return None
    before = parse_id(raw)
    if before is None:
        raise PageError(400, "bad page", f"before={shorten(raw)} is not a job id")
    return before


@guarded
async def overview(request: Request) -> Response:
    store = api_state(request).store
    rows = await store.queue_list()
    stats = stats_json(rows, await store.job_counts_finished())
    series = throughput_series(await store.throughput_recent(SPARK_MINUTES), SPARK_MINUTES)
    by_name = {q["name"]: q for q in (queue_json(r) for r in rows)}
    queues = []
    for name in sorted(set(by_name) | set(series)):
        q = by_name.get(name) or {"paused": False, "counts": dict.fromkeys(LIVE_STATES, 0)}
        counts = q["counts"]
        age = q.get("oldest_due_age_s")
        queues.append(
            {
                "name": name,
                "paused": q["paused"],
                "depth": counts["queued"] + counts["scheduled"] + counts["retrying"],
                "running": counts["running"],
                "waiting": counts["waiting"],
                "oldest_due": "-" if age is None else f"{age:.1f}s",
                "spark": spark(series.get(name, [0] * SPARK_MINUTES)),
            }
        )
    totals = [
        {"state": s, "jobs": f"~{n}" if s in stats["estimated"] else str(n)}
        for s, n in stats["jobs"].items()
    ]
    return page(
        request,
        "overview.html",
        title="queues",
        queues=queues,
        totals=totals,
        spark_minutes=SPARK_MINUTES,
        limits=[limit_json(x) for x in await store.limit_list()],
        schedules=[schedule_json(x) for x in await store.schedule_list()],
    )


async def _listing(request: Request, template: str, title: str, state: JobState | None) -> Response:
    type_ = _filter(request, "type", validate_type)
    queue = _filter(request, "queue", validate_queue)
    params = ListParams(
        limit=PAGE_SIZE, state=state, type=type_, queue=queue, before_id=_before(request)
    )
    listed = await api_state(request).store.job_list(params)
    found = [job_json(j) for j in listed.jobs]
    older = None
    if listed.next_before is not None:
        older = url(
            request.url.path,
            state=state.value if state and request.url.path == "/ui/jobs" else None,
            type=type_,
            queue=queue,
            before=listed.next_before,
        )
    scope = " and ".join(f"{k} {v}" for k, v in (("type", type_), ("queue", queue)) if v)
    return page(
        request,
        template,
        title=title,
        scope=scope,
        jobs=found,
        older=older,
        window=bounds.LIST_WINDOW if listed.window_ended else None,
        states=STATES,
        state=state.value if state else None,
        # the filter fields show what was typed, valid or not (escaped like all else)
        type_input=request.query_params.get("type", ""),
        queue_input=request.query_params.get("queue", ""),
        type=type_,
        queue=queue,
    )


@guarded
async def jobs(request: Request) -> Response:
    raw = request.query_params.get("state") or None
    state = JobState(raw) if raw in STATES else None
    return await _listing(request, "jobs.html", "jobs", state)


@guarded
async def dead(request: Request) -> Response:
    return await _listing(request, "dead.html", "dead letters", JobState.DEAD)


@guarded
async def job_page(request: Request) -> Response:
    job_id = path_id(request)
    store = api_state(request).store
    job = await store.job_get(job_id)
    if job is None:
        return message(request, "not found", f"no job {job_id}", 404)
    attempts = [attempt_json(a) for a in await store.job_attempts(job.id)]
    return page(request, "job.html", title=f"job {job.id}", job=job_json(job), attempts=attempts)


@guarded
async def workers(request: Request) -> Response:
    state = api_state(request)
    rows = await state.store.worker_list(int(state.settings.lease_ttl_s * 1000))
    return page(request, "workers.html", title="workers", workers=[worker_json(r) for r in rows])
