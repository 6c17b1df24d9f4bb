"""What every dashboard request passes before its handler: credentials, the CSRF
check on POSTs, and form bodies read strictly; :class:`PageError` for a 4xx page.

Credentials: :func:`deadman.api.auth.authenticate`, the API's own check (a Bearer
header, or the signed session that ``/ui/login`` started). With no
DEADMAN_API_TOKEN the dashboard is open, as the API is.

CSRF: every POST must come from a page of this server: its ``Origin`` (or, if a
browser sent none, its ``Referer``) must name the same host as the request's
``Host``; otherwise 403. The session cookie is SameSite=Lax as well, so a browser
does not send it with a cross-site POST at all.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from urllib.parse import parse_qsl, urlsplit

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from deadman.api.auth import authenticate
from deadman.api.ui.display import shorten
from deadman.api.ui.render import message

Handler = Callable[[Request], Awaitable[Response]]


class PageError(Exception):
    """Raise in a page or action to answer with a short error page (a 4xx)."""

    def __init__(self, status: int, title: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.title = title
        self.message = message


def token(request: Request) -> str | None:
    value: str | None = request.app.state.deadman.settings.api_token
    return value


def same_origin(request: Request) -> bool:
    source = request.headers.get("origin") or request.headers.get("referer")
    if not source or source == "null":
        return False
    try:
        netloc = urlsplit(source).netloc
    except ValueError:  # "http://[" and the like: no origin at all, so not ours
        return False
    return netloc.lower() == request.headers.get("host", "").lower()


def guarded(handler: Handler) -> Handler:
    """Signed in (else to the sign-in form), and for a POST: sent by our own page."""

    async def wrapper(request: Request) -> Response:
        verdict = authenticate(request, token(request), sessions=True)
        if not verdict.ok:
            if request.method == "GET":
                return RedirectResponse("/ui/login", status_code=303)
            return message(request, "sign in first", verdict.detail, 401)
        request.state.ui_via = verdict.via
        if request.method == "POST" and not same_origin(request):
            return message(request, "forbidden", "cross-site request refused", 403)
        try:
            return await handler(request)
        except PageError as exc:
            return message(request, exc.title, exc.message, exc.status)

    return wrapper


async def read_form(request: Request, fields: frozenset[str]) -> dict[str, str]:
    """A urlencoded form body of ``fields``, each at most once (the app's body size
    limit applies). Anything else is a 422 page, never read as a form with fewer
    fields: for the bulk replay, a form without filters means every dead job."""
    try:
        body = (await request.body()).decode("utf-8")
        pairs = parse_qsl(body, keep_blank_values=True, errors="strict")
    except UnicodeDecodeError:
        raise PageError(422, "bad form", "the form is not UTF-8") from None
    form: dict[str, str] = {}
    for name, value in pairs:
        if name not in fields or name in form:
            raise PageError(422, "bad form", f"unexpected field {shorten(name)!r} in the form")
        form[name] = value
    return form
