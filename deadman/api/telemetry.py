"""Request metrics of the API process, labelled by route template (``/jobs/{id}``,
never the raw path: one series per route, not per job id)."""

from __future__ import annotations

import time

from prometheus_client import Counter, Histogram
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send

REQUESTS = Counter(
    "deadman_api_requests",
    "HTTP requests answered, by route and status",
    ["method", "route", "status"],
)
LATENCY = Histogram(
    "deadman_api_request_seconds",
    "Time to answer an HTTP request, by route",
    ["route"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)


class RequestMetrics:
    """ASGI middleware counting every answered request, errors included."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500

        async def recording_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, recording_send)
        finally:
            route = scope.get("route")
            template = (
                route.path if isinstance(route, BaseRoute) and hasattr(route, "path") else "-"
            )
            REQUESTS.labels(scope["method"], template, str(status)).inc()
            LATENCY.labels(template).observe(time.perf_counter() - start)
