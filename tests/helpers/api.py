"""The API as tests meet it: an app, served, its clients, and problem assertions.

The app runs on a real uvicorn server in a thread, on a free 127.0.0.1 port, and the
tests talk HTTP to it: real sockets, real header parsing, real concurrency. (Starlette's
TestClient is not used: with our httpx it raises a deprecation warning, and warnings
are errors here.) Every client refuses a 500 outright, so a test that provoked one
fails even when it only looked at something else: the suite proves there are none.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import uvicorn
from starlette.applications import Starlette

from deadman.api import create_app
from deadman.api.protocol import HttpProtocol
from deadman.config import Settings
from tests.helpers import wait_for

JSON = {"Content-Type": "application/json"}
PROBLEM = "application/problem+json"


def make_app(
    dsn: str, *, pool_timeout_s: float = 2.0, pool_max_size: int = 4, **settings: Any
) -> Starlette:
    return create_app(
        Settings(database_url=dsn, **settings),
        dsn,
        pool_timeout_s=pool_timeout_s,
        pool_max_size=pool_max_size,
    )


def _no_500(response: httpx.Response) -> None:
    if response.status_code == 500:
        response.read()
        raise AssertionError(f"the server answered 500: {response.text}")


@contextmanager
def serve(app: Starlette) -> Iterator[str]:
    """Serve ``app`` with uvicorn in a thread; yields the base URL. The socket is bound
    before the server starts, so nothing can take the port in between."""
    # IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY on accepted sockets only when the
    # protocol is explicit; without it Nagle holds each response body ~40 ms.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(app, http=HttpProtocol, log_level="warning", lifespan="on")
    )
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        wait_for(lambda: server.started, timeout=15, message="uvicorn to start")
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=15)
        sock.close()


def client(base_url: str, **kwargs: Any) -> httpx.Client:
    return httpx.Client(
        base_url=base_url, timeout=30, event_hooks={"response": [_no_500]}, **kwargs
    )


@contextmanager
def api_client(dsn: str, **kwargs: Any) -> Iterator[httpx.Client]:
    """A client of a fresh app on a fresh server over ``dsn``."""
    with serve(make_app(dsn, **kwargs)) as base_url, client(base_url) as c:
        yield c


def post_together(
    dsn: str, path: str, bodies: list[Any], headers: dict[str, str]
) -> list[httpx.Response]:
    """POST each body from its own thread and connection, all released at once by a
    barrier (each connects first, so the requests really race); responses in order."""
    n = len(bodies)
    barrier = threading.Barrier(n)
    responses: list[httpx.Response | None] = [None] * n
    with serve(make_app(dsn, pool_max_size=10)) as base_url:

        def submit(i: int) -> None:
            with client(base_url) as c:
                c.get("/health")
                barrier.wait(timeout=30)
                responses[i] = c.post(path, json=bodies[i], headers=headers)

        threads = [threading.Thread(target=submit, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
    assert all(r is not None for r in responses), "a request did not finish"
    return [r for r in responses if r is not None]


def new_job(**fields: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"type": "noop", "payload": {"n": 1}}
    body.update(fields)
    return body


def assert_problem(
    response: httpx.Response, status: int, kind: str | None = None
) -> dict[str, Any]:
    """The response is an RFC 9457 problem with this status (and type tail)."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith(PROBLEM), response.headers
    body: dict[str, Any] = response.json()
    assert {"type", "title", "status", "detail"} <= body.keys(), body
    assert body["status"] == status
    assert "Traceback" not in response.text
    if kind is not None:
        assert body["type"].endswith(":" + kind), body
    return body


def error_fields(response: httpx.Response) -> set[str]:
    body = assert_problem(response, 422)
    return {e["field"] for e in body.get("errors", [])}
