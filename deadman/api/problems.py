"""RFC 9457 problem details: every error the API sends, and the exception handlers.

Every error response is ``application/problem+json`` with ``type``, ``title``,
``status`` and ``detail`` (422s add ``errors``: one ``{"field", "message"}`` per
broken field). Clients dispatch on ``type``, a tag URI per kind of problem (RFC 9457
allows non-resolvable ones); ``detail`` is for humans and never carries a stack trace.
Transient trouble (database down, pool exhausted, queue full) carries ``Retry-After``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from http import HTTPStatus
from typing import Any

from psycopg_pool import PoolClosed, PoolTimeout
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Send

from deadman import logs
from deadman.errors import (
    Conflict,
    DatabaseUnavailable,
    DeadmanError,
    DuplicateKey,
    IllegalTransition,
    InvalidJob,
    NotFound,
    SchemaMismatch,
)
from deadman.storable import FieldError

log = logs.get("deadman.api")

PROBLEM_JSON = "application/problem+json"
TYPE_PREFIX = "tag:deadman.dev,2025:problem:"
#: Seconds a client should wait before retrying after a 503 (database trouble).
RETRY_AFTER_UNAVAILABLE_S = 2
#: ... and after a 429 (queue at its cap: workers need time to drain it).
RETRY_AFTER_QUEUE_FULL_S = 5

#: slug -> (status, title). The slugs are the tail of ``type``; documented in openapi.py.
KINDS: dict[str, tuple[int, str]] = {
    slug: (int(status), title.strip())
    for slug, status, title in (
        line.split(maxsplit=2)
        for line in """
        malformed-json          400 Malformed JSON
        unauthorized            401 Unauthorized
        not-found               404 Not Found
        method-not-allowed      405 Method Not Allowed
        conflict                409 Conflict
        content-too-large       413 Content Too Large
        unsupported-media-type  415 Unsupported Media Type
        validation              422 Validation Failed
        idempotency-key-reused  422 Idempotency Key Reused
        queue-full              429 Queue Full
        internal                500 Internal Server Error
        database-unavailable    503 Database Unavailable
        not-ready               503 Not Ready
        http                    400 Bad Request
        """.strip().splitlines()
    )
}
#: "http" is any other HTTP-level error; its title comes from the status


class Problem(Exception):
    """Raise anywhere in a request to answer with this problem."""

    def __init__(
        self,
        kind: str,
        detail: str,
        *,
        errors: Sequence[FieldError] = (),
        headers: Mapping[str, str] | None = None,
        status: int | None = None,
        title: str | None = None,
    ) -> None:
        super().__init__(detail)
        default_status, default_title = KINDS[kind]
        self.kind = kind
        self.status = status or default_status
        self.title = title or default_title
        self.detail = detail
        self.errors = list(errors)
        self.headers = dict(headers or {})

    def body(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "type": TYPE_PREFIX + self.kind,
            "title": self.title,
            "status": self.status,
            "detail": self.detail,
        }
        if self.errors:
            doc["errors"] = self.errors
        return doc

    def response(self) -> Response:
        content = json.dumps(self.body(), ensure_ascii=False, separators=(",", ":"))
        return Response(
            content, status_code=self.status, headers=self.headers, media_type=PROBLEM_JSON
        )

    async def send(self, send: Send) -> None:
        """Send as a raw ASGI response (for middleware, below the Starlette app)."""
        response = self.response()
        await send(
            {
                "type": "http.response.start",
                "status": response.status_code,
                "headers": response.raw_headers,
            }
        )
        await send({"type": "http.response.body", "body": response.body})


def deleted(found: bool, missing: str) -> Response:
    """A DELETE's answer: 204, or 404 with ``missing`` when there was nothing."""
    if not found:
        raise Problem("not-found", missing)
    return Response(status_code=204)


def validation(errors: Sequence[FieldError], detail: str | None = None) -> Problem:
    """A 422 naming every broken field."""
    if detail is None:
        names = ", ".join(e["field"] for e in errors[:5])
        detail = f"the request breaks the schema: {names}" + (" ..." if len(errors) > 5 else "")
    return Problem("validation", detail, errors=errors)


def unavailable(detail: str) -> Problem:
    return Problem(
        "database-unavailable",
        detail,
        headers={"Retry-After": str(RETRY_AFTER_UNAVAILABLE_S)},
    )


# ---------------------------------------------------------------- exception handlers


async def on_problem(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, Problem)
    return exc.response()


async def on_http_exception(request: Request, exc: Exception) -> Response:
    """Starlette's own errors (unknown route 404, wrong method 405 with Allow)."""
    assert isinstance(exc, HTTPException)
    headers = dict(exc.headers or {})
    if exc.status_code == 404:
        return Problem("not-found", f"no resource at {request.url.path}").response()
    if exc.status_code == 405:
        allow = headers.get("Allow", "")
        detail = f"{request.method} is not allowed on {request.url.path}; allowed: {allow}"
        return Problem("method-not-allowed", detail, headers=headers).response()
    title = _reason(exc.status_code)
    return Problem(
        "http", str(exc.detail), headers=headers, status=exc.status_code, title=title
    ).response()


async def on_deadman_error(request: Request, exc: Exception) -> Response:
    """Domain errors raised below the routes (store, model) become problems here."""
    return problem_for(exc).response()


async def on_pool_error(request: Request, exc: Exception) -> Response:
    """Pool trouble that reached us untranslated is still transient, never a 500."""
    return unavailable("no database connection became available in time").response()


async def on_unexpected(request: Request, exc: Exception) -> Response:
    """The last resort (Starlette's ServerErrorMiddleware calls it, then re-raises for
    the server's log). The client learns nothing about the internals."""
    log.error("unexpected_error", path=request.url.path, error=type(exc).__name__)
    return Problem("internal", "an unexpected error occurred; it has been logged").response()


def problem_for(exc: Exception) -> Problem:
    if isinstance(exc, DatabaseUnavailable):
        return unavailable("the database is unreachable or has no free connection; retry later")
    if isinstance(exc, SchemaMismatch):
        return Problem("not-ready", str(exc), headers={"Retry-After": "30"})
    if isinstance(exc, NotFound):
        return Problem("not-found", str(exc))
    if isinstance(exc, Conflict | IllegalTransition):
        return Problem("conflict", str(exc))
    if isinstance(exc, DuplicateKey):
        return Problem("idempotency-key-reused", str(exc))
    if isinstance(exc, InvalidJob):
        return validation([{"field": "body", "message": str(exc)}], detail=str(exc))
    if isinstance(exc, DeadmanError):
        log.error("unmapped_deadman_error", error=type(exc).__name__)
    return Problem("internal", "an unexpected error occurred; it has been logged")


def _reason(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"


EXCEPTION_HANDLERS: dict[Any, Any] = {
    Problem: on_problem,
    HTTPException: on_http_exception,
    DeadmanError: on_deadman_error,
    PoolTimeout: on_pool_error,
    PoolClosed: on_pool_error,
    Exception: on_unexpected,
}
