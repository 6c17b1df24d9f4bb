"""The operator endpoints: queues (pause/resume), workers, stats, and the probes
(health, ready, metrics) plus the OpenAPI document."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from deadman.api import schema
from deadman.api.openapi import document
from deadman.api.problems import Problem
from deadman.api.serialize import queue_json, stats_json, worker_json
from deadman.api.state import ApiState, api_state
from deadman.errors import DatabaseUnavailable


async def list_queues(request: Request) -> Response:
    rows = await api_state(request).store.queue_list()
    return JSONResponse({"queues": [queue_json(r) for r in rows]})


async def pause_queue(request: Request) -> Response:
    """Workers stop claiming from the queue (running jobs finish); submissions go on."""
    return await _set_paused(request, True)


async def resume_queue(request: Request) -> Response:
    return await _set_paused(request, False)


async def _set_paused(request: Request, paused: bool) -> Response:
    name = schema.parse_queue_name(request.path_params["name"])
    row = await api_state(request).store.queue_set_paused(name, paused)
    return JSONResponse(queue_json(row))


async def list_workers(request: Request) -> Response:
    """Registered workers; ``alive`` when one beat within the lease TTL."""
    state = api_state(request)
    rows = await state.store.worker_list(int(state.settings.lease_ttl_s * 1000))
    return JSONResponse({"workers": [worker_json(r) for r in rows]})


async def stats(request: Request) -> Response:
    rows = await api_state(request).store.stats_get()
    return JSONResponse(stats_json(rows))


async def health(request: Request) -> Response:
    """The process is up and serving. Touches nothing else: never fails while we run."""
    return JSONResponse({"status": "ok"})


async def ready(request: Request) -> Response:
    """200 only if the database answers and its schema is the one this code needs."""
    state = api_state(request)
    have = await state.store.schema_version_get()
    if have != state.schema_version:
        raise Problem(
            "not-ready",
            f"the database schema is at version {have}, this server needs "
            f"{state.schema_version}; run `deadman migrate`",
            headers={"Retry-After": "30"},
        )
    return JSONResponse({"status": "ready", "schema_version": have})


class _JobGauges:
    """Job counts as Prometheus gauges, computed from one query at scrape time (a
    plain object with ``collect``: what CollectorRegistry.register asks for)."""

    def __init__(self, rows: Sequence[Mapping[str, Any]] | None) -> None:
        self._rows = rows

    def collect(self) -> Iterator[GaugeMetricFamily]:
        up = GaugeMetricFamily(
            "deadman_api_database_up", "1 if the database answered this scrape's query"
        )
        up.add_metric([], 0 if self._rows is None else 1)
        yield up
        if self._rows is None:
            return
        jobs = GaugeMetricFamily(
            "deadman_jobs", "Jobs by queue and state at scrape time", labels=["queue", "state"]
        )
        for queue, counts in stats_json(self._rows)["queues"].items():
            for job_state, n in counts.items():
                jobs.add_metric([queue, job_state], n)
        yield jobs


async def metrics(request: Request) -> Response:
    """This process's metrics plus job gauges. A database outage does not fail the
    scrape (Prometheus would lose the process metrics too): the gauges are left out
    and ``deadman_api_database_up`` says 0."""
    state: ApiState = request.app.state.deadman
    rows: Sequence[Mapping[str, Any]] | None = None
    if state.store is not None:  # None only while the server starts or stops
        with contextlib.suppress(DatabaseUnavailable):
            rows = await state.store.stats_get()
    scrape = CollectorRegistry(auto_describe=False)
    scrape.register(_JobGauges(rows))
    body = generate_latest(REGISTRY) + generate_latest(scrape)
    return Response(body, media_type=CONTENT_TYPE_LATEST)


async def openapi(request: Request) -> Response:
    state: ApiState = request.app.state.deadman
    return JSONResponse(document(state.settings))


ROUTES = [
    Route("/queues", list_queues, methods=["GET"]),
    Route("/queues/{name}/pause", pause_queue, methods=["POST"]),
    Route("/queues/{name}/resume", resume_queue, methods=["POST"]),
    Route("/workers", list_workers, methods=["GET"]),
    Route("/stats", stats, methods=["GET"]),
    Route("/health", health, methods=["GET"]),
    Route("/ready", ready, methods=["GET"]),
    Route("/metrics", metrics, methods=["GET"]),
    Route("/openapi.json", openapi, methods=["GET"]),
]
