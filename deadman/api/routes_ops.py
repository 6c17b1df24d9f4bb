"""The operator endpoints: queues (pause/resume), workers, stats, and the probes
(health, ready, metrics) plus the OpenAPI document.

Counting stays cheap however big the jobs table grows: unfinished jobs (the backlog)
are counted exactly, per queue and state, by reading only their rows; finished jobs
(millions, kept by retention) only in total per state, exactly up to a cap and past
it from the planner's statistics, and every such number says it is an estimate.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from deadman.api.named import Named
from deadman.api.openapi import document
from deadman.api.problems import Problem, unavailable
from deadman.api.serialize import STATES, worker_json
from deadman.api.state import ApiState, api_state
from deadman.errors import DatabaseUnavailable
from deadman.model import JobState
from deadman.store import FINISHED_COUNT_CAP, AsyncStore

LIVE_STATES: tuple[str, ...] = tuple(s.value for s in JobState if not s.terminal)
FINISHED_STATES: tuple[str, ...] = tuple(s.value for s in JobState if s.terminal)


def live_counts_json(counts: Mapping[str, Any] | None) -> dict[str, int]:
    """Every unfinished state present, zero when no job is in it."""
    got = counts or {}
    return {state: int(got.get(state, 0)) for state in LIVE_STATES}


def queue_json(row: Mapping[str, Any]) -> dict[str, Any]:
    """A queue_list / queue_set_paused row: exact counts of its unfinished jobs and
    how long its oldest due job has waited (null when none is due)."""
    oldest = row["oldest_due_at"]
    age = None if oldest is None else max(0.0, (row["now"] - oldest).total_seconds())
    return {
        "name": row["name"],
        "paused": bool(row["paused"]),
        "counts": live_counts_json(row["counts"]),
        "oldest_due_age_s": age,
    }


def stats_json(
    queues: Iterable[Mapping[str, Any]], finished: Iterable[Mapping[str, Any]]
) -> dict[str, Any]:
    """Totals by state (``estimated`` names the states whose count is an estimate, and
    then ``total`` is one too) and the unfinished counts per queue."""
    per_queue = {str(q["name"]): live_counts_json(q["counts"]) for q in queues}
    totals: dict[str, int] = dict.fromkeys(STATES, 0)
    for counts in per_queue.values():
        for state, n in counts.items():
            totals[state] += n
    estimated: list[str] = []
    for row in finished:
        totals[str(row["state"])] = int(row["n"])
        if row["estimated"]:
            estimated.append(str(row["state"]))
    return {
        "jobs": totals,
        "total": sum(totals.values()),
        "estimated": sorted(estimated),
        "queues": per_queue,
    }


async def list_workers(request: Request) -> Response:
    """Registered workers; ``alive`` when one beat within the lease TTL."""
    state = api_state(request)
    rows = await state.store.worker_list(int(state.settings.lease_ttl_s * 1000))
    return JSONResponse({"workers": [worker_json(r) for r in rows]})


async def stats(request: Request) -> Response:
    store = api_state(request).store
    queues = await store.queue_list()
    return JSONResponse(stats_json(queues, await store.job_counts_finished()))


async def health(request: Request) -> Response:
    """The process is up and serving. Touches nothing else: never fails while we run."""
    return JSONResponse({"status": "ok"})


#: how long /ready waits for the database before it answers 503
READY_TIMEOUT_S = 0.8


async def ready(request: Request) -> Response:
    """200 only if the database answers and its schema is the one this code needs."""
    state = api_state(request)
    try:
        # A probe's own timeout is often 1 s (Kubernetes' default): answer within it
        # rather than after the pool's whole wait for a connection.
        have = await asyncio.wait_for(state.store.schema_version_get(), READY_TIMEOUT_S)
    except TimeoutError:
        raise unavailable(
            f"the database did not answer within {READY_TIMEOUT_S} s; retry later"
        ) from None
    if have != state.schema_version:
        raise Problem(
            "not-ready",
            f"the database schema is at version {have}, this server needs "
            f"{state.schema_version}; run `deadman migrate`",
            headers={"Retry-After": "30"},
        )
    return JSONResponse({"status": "ready", "schema_version": have})


class _JobGauges:
    """Job gauges computed at scrape time from two cheap queries (a plain object with
    ``collect``: what CollectorRegistry.register asks for)."""

    def __init__(
        self,
        queues: Sequence[Mapping[str, Any]] | None,
        finished: Sequence[Mapping[str, Any]] | None,
        horizon_age: int | None = None,
    ) -> None:
        self._queues = queues
        self._finished = finished
        self._horizon_age = horizon_age

    def collect(self) -> Iterator[GaugeMetricFamily]:
        up = GaugeMetricFamily(
            "deadman_api_database_up", "1 if the database answered this scrape's queries"
        )
        up.add_metric([], 0 if self._queues is None or self._finished is None else 1)
        yield up
        if self._queues is None or self._finished is None:
            return
        jobs = GaugeMetricFamily(
            "deadman_jobs",
            "Unfinished jobs by queue and state (exact, at scrape time)",
            labels=["queue", "state"],
        )
        oldest = GaugeMetricFamily(
            "deadman_queue_oldest_due_age_seconds",
            "How long the oldest due (claimable) job of the queue has waited; 0 if none",
            labels=["queue"],
        )
        paused = GaugeMetricFamily(
            "deadman_queue_paused", "1 if the queue is paused", labels=["queue"]
        )
        for row in self._queues:
            q = queue_json(row)
            for job_state, n in q["counts"].items():
                jobs.add_metric([q["name"], job_state], n)
            oldest.add_metric([q["name"]], q["oldest_due_age_s"] or 0.0)
            paused.add_metric([q["name"]], 1 if q["paused"] else 0)
        finished = GaugeMetricFamily(
            "deadman_jobs_finished",
            f"Finished jobs by state, all queues. ESTIMATE above {FINISHED_COUNT_CAP}: "
            "exact up to that many, beyond it the planner's estimate (pg_class.reltuples "
            "scaled to the table's size x the state's pg_stats frequency, as fresh as the "
            "last ANALYZE); deadman_jobs_finished_estimated says which",
            labels=["state"],
        )
        estimated = GaugeMetricFamily(
            "deadman_jobs_finished_estimated",
            "1 if deadman_jobs_finished for this state is an estimate, 0 if exact",
            labels=["state"],
        )
        for row in self._finished:
            finished.add_metric([str(row["state"])], int(row["n"]))
            estimated.add_metric([str(row["state"])], 1 if row["estimated"] else 0)
        horizon = GaugeMetricFamily(
            "deadman_xmin_horizon_age_transactions",
            "Transactions since the oldest still-running transaction in the cluster began; "
            "while it grows (a transaction left open) vacuum reclaims nothing newer and the "
            "jobs table bloats: alert on it",
        )
        horizon.add_metric([], self._horizon_age or 0)
        yield from (jobs, oldest, paused, finished, estimated, horizon)


async def metrics(request: Request) -> Response:
    """This process's metrics plus job gauges. A database outage does not fail the
    scrape (Prometheus would lose the process metrics too): the gauges are left out
    and ``deadman_api_database_up`` says 0."""
    state: ApiState = request.app.state.deadman
    queues: Sequence[Mapping[str, Any]] | None = None
    finished: Sequence[Mapping[str, Any]] | None = None
    horizon: int | None = None
    if state.store is not None:  # None only while the server starts or stops
        with contextlib.suppress(DatabaseUnavailable):
            queues = await state.store.queue_list()
            finished = await state.store.job_counts_finished()
            horizon = await state.store.xmin_horizon_age()
    scrape = CollectorRegistry(auto_describe=False)
    scrape.register(_JobGauges(queues, finished, horizon))
    body = generate_latest(REGISTRY) + generate_latest(scrape)
    return Response(body, media_type=CONTENT_TYPE_LATEST)


async def openapi(request: Request) -> Response:
    state: ApiState = request.app.state.deadman
    return JSONResponse(document(state.settings))


#: Any name is a queue (one may be paused before its first job): never a 404.
QUEUES = Named[Mapping[str, Any]]("queues", "name", "no queue", queue_json)

ROUTES = [
    QUEUES.list_route(AsyncStore.queue_list),
    # Pausing stops workers claiming from the queue (running jobs finish); submissions
    # go on.
    *QUEUES.pause_routes(AsyncStore.queue_set_paused),
    Route("/workers", list_workers, methods=["GET"]),
    Route("/stats", stats, methods=["GET"]),
    Route("/health", health, methods=["GET"]),
    Route("/ready", ready, methods=["GET"]),
    Route("/metrics", metrics, methods=["GET"]),
    Route("/openapi.json", openapi, methods=["GET"]),
]
