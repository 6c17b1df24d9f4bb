"""Request metrics of the API process.

Every label comes from a closed set, never from the request as sent: this middleware
runs before authentication (a refused request is counted too), so anything a client
could choose freely would let anyone, without a token, make series without end, each
kept in memory for the life of the process and scraped forever (an invented method
token per request made one series per request). So: the method is one of RFC 9110's
(plus PATCH) or ``other``; the route is the template the router matched
(``/jobs/{id}``, ``/ui/jobs/{id}``: one series per route, not per job id) or ``-``
when no route matched; the status is the one this server chose to send.
"""

from __future__ import annotations

import time
from typing import Any

from prometheus_client import Counter, Histogram
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

REQUESTS = Counter(
    "deadman_api_requests",
    "HTTP requests answered, by method, route and status",
    ["method", "route", "status"],
)
LATENCY = Histogram(
    "deadman_api_request_seconds",
    "Time to answer an HTTP request, by route",
    ["route"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
#: How many POST /jobs submissions each group commit wrote in one statement and one
#: WAL flush (deadman.api.group_commit): ones mean each request paid a commit of its
#: own; the mean (``_sum / _count``) is what the server's CPU and the disk's flushes
#: are shared by. Groups written again row by row (a row was refused) are not counted.
GROUP_SIZE = Histogram(
    "deadman_api_group_commit_size",
    "POST /jobs submissions written together in one statement and one commit",
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
)

#: The method label's values, with "other" for every other token a client sends.
METHODS = frozenset(
    {"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "CONNECT", "OPTIONS", "TRACE"}
)
#: The route label of a request no route matched (unknown path, refused by auth).
NO_ROUTE = "-"


def method_label(method: str) -> str:
    return method if method in METHODS else "other"


def route_label(scope: Scope, root_path: str) -> str:
    """The matched route's template, under the mount it was found in: the router
    records the route in the scope and a mount extends ``root_path``, so the UI's
    ``/jobs/{id}`` is told apart from the API's. A mount that matched no route of its
    own (``/ui/nope``) is no route either."""
    route = scope.get("route")
    if not isinstance(route, Route):
        return NO_ROUTE
    mount = str(scope.get("root_path", ""))[len(root_path) :]
    return mount + route.path


class RequestMetrics:
    """ASGI middleware counting every answered request, errors included.

    The labelled children are kept here by their labels: ``labels()`` checks and
    locks on every call, a few µs per request twice over; the keys come from the
    closed sets above, so this holds as many entries as the metrics have series."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self._counters: dict[tuple[str, str, str], Any] = {}
        self._latencies: dict[str, Any] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        root_path = str(scope.get("root_path", ""))
        status = 500

        async def recording_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, recording_send)
        finally:
            route = route_label(scope, root_path)
            labels = (method_label(scope["method"]), route, str(status))
            counter = self._counters.get(labels)
            if counter is None:
                counter = self._counters[labels] = REQUESTS.labels(*labels)
            latency = self._latencies.get(route)
            if latency is None:
                latency = self._latencies[route] = LATENCY.labels(route)
            counter.inc()
            latency.observe(time.perf_counter() - start)
