"""Signing in to the dashboard with the API token, and signing out.

A sign-in replaces whatever session the browser had (a fresh id and issue time: a
session planted before sign-in is never promoted), see deadman/api/auth.py for
what a session is and how long it lives.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from deadman import logs
from deadman.api.auth import new_session, token_matches
from deadman.api.ui.guard import PageError, read_form, same_origin, token
from deadman.api.ui.render import page

log = logs.get("deadman.api.ui")


def _form(request: Request, error: str = "", status: int = 200) -> Response:
    return page(request, "login.html", status, title="sign in", error=error)


async def login_form(request: Request) -> Response:
    return _form(request)


async def login(request: Request) -> Response:
    if not same_origin(request):
        return _form(request, "cross-site sign-in refused", 403)
    expected = token(request)
    try:
        given = (await read_form(request, frozenset({"token"}))).get("token", "")
    except PageError as exc:
        return _form(request, exc.message, exc.status)
    if expected is None:
        return RedirectResponse("/ui/", status_code=303)
    if not token_matches(given.encode(), expected):
        # who tried, never what they typed: a near-miss token is a secret too
        client = request.client.host if request.client else None
        log.warning("dashboard_sign_in_refused", client=client)
        return _form(request, "that token is not valid", 401)
    request.session.clear()
    request.session.update(new_session())
    return RedirectResponse("/ui/", status_code=303)


async def logout(request: Request) -> Response:
    """Needs no credentials (an expired session must be able to leave too), only a
    same-origin POST, so another site cannot sign a person out."""
    if not same_origin(request):
        return _form(request, "cross-site sign-out refused", 403)
    if "session" in request.scope:
        request.session.clear()
    return RedirectResponse("/ui/login", status_code=303)
