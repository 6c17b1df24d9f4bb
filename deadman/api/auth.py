"""Who may call: the one check of ``DEADMAN_API_TOKEN``, for the API and the dashboard.

Off when ``DEADMAN_API_TOKEN`` is unset. When set, :func:`authenticate` accepts

- ``Authorization: Bearer <token>``, everywhere (the API, scripts, a proxy);
- on the dashboard only, a signed session that its sign-in form started. A browser
  cannot send the header, so it signs in once with the token and then carries a
  cookie instead. The cookie opens the dashboard and nothing else: the JSON API
  never reads it, so a page on another site cannot drive the API with it.

:class:`BearerAuth` refuses an API request that fails the check with 401 and
``WWW-Authenticate: Bearer`` (RFC 6750) before any route runs or any body is read;
unknown paths too, so a caller without the token learns nothing about which routes
exist. ``/health`` stays open because load balancers probe it without credentials,
and it reveals nothing. The dashboard (``/ui``) calls :func:`authenticate` itself,
because it answers a refusal with its sign-in form, not a problem document.

Tokens are compared in one place, :func:`token_matches`: constant-time over SHA-256
digests of both sides, so neither the content nor the length of the expected token
leaks through timing. The token is never logged (nor is the Authorization header),
and never put in a cookie.

Sessions are Starlette's ``SessionMiddleware``: the cookie is the session itself
(JSON, base64), signed by itsdangerous with a key derived from the token and a
purpose string. So every server that shares the token accepts every session,
nothing is stored, and rotating the token ends every session at once. Each session
carries its own random id and the time it was issued, and :func:`session_valid`
refuses one older than :data:`SESSION_TTL_S` on the server, whatever the browser
does with the cookie's Max-Age. Signing out clears the cookie in that browser; a
copied cookie stays good until it expires or the token rotates (there is no
server-side list of sessions to revoke one from).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass
from typing import Any

from starlette.middleware.sessions import SessionMiddleware
from starlette.requests import HTTPConnection
from starlette.types import ASGIApp, Receive, Scope, Send

from deadman.api.problems import Problem

OPEN_PATHS = frozenset({"/health"})
#: The dashboard's prefix: it checks credentials itself (see the module docstring).
DASHBOARD_PREFIX = "/ui"
SESSION_COOKIE = "deadman_session"
#: A session's absolute lifetime: a working day, then sign in again.
SESSION_TTL_S = 12 * 3600
#: How far in the future an issue time may be (clocks of servers sharing a token).
SESSION_SKEW_S = 60
SESSION_VERSION = 1
#: Binds the derived key to this one use: the same token keys nothing else.
_SESSION_PURPOSE = b"deadman dashboard session key v1"


@dataclass(frozen=True)
class Verdict:
    """What :func:`authenticate` found. ``via`` is None when the request is refused;
    ``detail`` and ``error`` (RFC 6750's error code) then say why."""

    via: str | None  # "open" (no token configured), "bearer", "session"
    detail: str = ""
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.via is not None


def token_matches(given: bytes, token: str) -> bool:
    """The only comparison of a presented token (its bytes as sent) with the
    configured one (UTF-8)."""
    given_digest = hashlib.sha256(given).digest()
    return hmac.compare_digest(given_digest, hashlib.sha256(token.encode()).digest())


def authenticate(conn: HTTPConnection, token: str | None, *, sessions: bool) -> Verdict:
    """Check a request's credentials against ``token`` (``DEADMAN_API_TOKEN``).

    A Bearer header decides on its own. Without one (or with another scheme, which
    an authenticating proxy in front of the dashboard may add), a dashboard request
    (``sessions=True``) passes with a valid session.
    """
    if token is None:
        return Verdict("open")
    header = conn.headers.get("authorization")
    scheme, _, given = (header or "").partition(" ")
    given = given.strip()
    if scheme.lower() == "bearer" and given:
        # Starlette decodes headers as latin-1: encoding back gives the bytes sent.
        if token_matches(given.encode("latin-1"), token):
            return Verdict("bearer")
        return Verdict(None, "the bearer token is not valid", "invalid_token")
    if sessions and "session" in conn.scope and session_valid(conn.session):
        return Verdict("session")
    if header is None:
        return Verdict(None, "this endpoint needs an Authorization: Bearer token")
    return Verdict(None, "use the Bearer scheme: Authorization: Bearer <token>")


def session_secret(token: str) -> str:
    """The sessions' signing key: a function of the token, so rotating it ends them."""
    return hmac.new(token.encode(), _SESSION_PURPOSE, hashlib.sha256).hexdigest()


def new_session(now: float | None = None) -> dict[str, Any]:
    """What a sign-in stores: a random id (no two sessions alike) and its issue time."""
    issued = time.time() if now is None else now
    return {"v": SESSION_VERSION, "sid": secrets.token_urlsafe(16), "iat": int(issued)}


def session_valid(session: dict[str, Any], now: float | None = None) -> bool:
    """A session this version issued less than :data:`SESSION_TTL_S` ago."""
    issued = session.get("iat")
    if session.get("v") != SESSION_VERSION or type(issued) is not int:
        return False
    current = time.time() if now is None else now
    return current - SESSION_TTL_S < issued <= current + SESSION_SKEW_S


class DashboardSessions:
    """ASGI middleware: Starlette's session middleware for ``/ui`` paths only (the API
    never reads a session), its cookie HttpOnly, SameSite=Lax, ``Path=/ui``, and
    Secure when the request came over https. A no-op when ``token`` is None.

    SameSite=Lax, not Strict, so a link to a job page from a chat or a mail opens
    it signed in; cross-site POSTs are stopped by the dashboard's same-origin check
    on every form (see deadman/api/ui/guard.py), and GET pages change nothing.
    """

    def __init__(self, app: ASGIApp, token: str | None) -> None:
        self.app = app
        self._by_scheme: dict[bool, SessionMiddleware] = {}
        if token is not None:
            for https in (False, True):
                self._by_scheme[https] = SessionMiddleware(
                    app,
                    secret_key=session_secret(token),
                    session_cookie=SESSION_COOKIE,
                    max_age=SESSION_TTL_S,
                    path=DASHBOARD_PREFIX,
                    same_site="lax",
                    https_only=https,
                )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self._by_scheme or not _dashboard(scope):
            await self.app(scope, receive, send)
            return
        await self._by_scheme[scope.get("scheme") == "https"](scope, receive, send)


class BearerAuth:
    """ASGI middleware for the API; a no-op when ``token`` is None."""

    def __init__(self, app: ASGIApp, token: str | None) -> None:
        self.app = app
        self._token = token

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or self._token is None
            or scope.get("path", "") in OPEN_PATHS
            or _dashboard(scope)
        ):
            await self.app(scope, receive, send)
            return
        verdict = authenticate(HTTPConnection(scope), self._token, sessions=False)
        if not verdict.ok:
            challenge = 'Bearer realm="deadman"'
            if verdict.error:
                challenge += f', error="{verdict.error}"'
            problem = Problem(
                "unauthorized", verdict.detail, headers={"WWW-Authenticate": challenge}
            )
            await problem.send(send)
            return
        await self.app(scope, receive, send)


def _dashboard(scope: Scope) -> bool:
    path: str = scope.get("path", "")
    return path == DASHBOARD_PREFIX or path.startswith(DASHBOARD_PREFIX + "/")
