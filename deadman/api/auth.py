"""Bearer-token authentication for every endpoint but ``/health``.

Off when ``DEADMAN_API_TOKEN`` is unset. When set, a request without
``Authorization: Bearer <token>`` gets 401 with ``WWW-Authenticate: Bearer`` (RFC
6750) before any route runs or any body is read; unknown paths too, so a caller
without the token learns nothing about which routes exist. ``/health`` stays open
because load balancers probe it without credentials, and it reveals nothing.

The comparison is constant-time over SHA-256 digests of both sides, so neither the
content nor the length of the expected token leaks through timing. The token is
never logged (nor is the Authorization header).
"""

from __future__ import annotations

import hashlib
import hmac

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from deadman.api.problems import Problem

OPEN_PATHS = frozenset({"/health"})
#: The dashboard checks the same token itself (header, or the cookie its sign-in form
#: sets: a browser cannot send the header), see deadman/api/ui/routes.py.
OWN_AUTH_PREFIX = "/ui"


class BearerAuth:
    """ASGI middleware; a no-op when ``token`` is None."""

    def __init__(self, app: ASGIApp, token: str | None) -> None:
        self.app = app
        self._digest = None if token is None else hashlib.sha256(token.encode()).digest()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if (
            scope["type"] != "http"
            or self._digest is None
            or path in OPEN_PATHS
            or path == OWN_AUTH_PREFIX
            or path.startswith(OWN_AUTH_PREFIX + "/")
        ):
            await self.app(scope, receive, send)
            return
        header = Headers(scope=scope).get("authorization")
        if header is None:
            await _refuse("this endpoint needs an Authorization: Bearer token", None, send)
            return
        scheme, _, given = header.partition(" ")
        given = given.strip()
        if scheme.lower() != "bearer" or not given:
            await _refuse("use the Bearer scheme: Authorization: Bearer <token>", None, send)
            return
        given_digest = hashlib.sha256(given.encode("latin-1")).digest()
        if not hmac.compare_digest(given_digest, self._digest):
            await _refuse("the bearer token is not valid", "invalid_token", send)
            return
        await self.app(scope, receive, send)


async def _refuse(detail: str, error: str | None, send: Send) -> None:
    challenge = 'Bearer realm="deadman"' + (f', error="{error}"' if error else "")
    await Problem("unauthorized", detail, headers={"WWW-Authenticate": challenge}).send(send)
