"""The dashboard's Jinja2 environment: templates from ``templates/``, autoescaped.

Autoescape is on for every ``.html`` template, so a value can reach a page only as
text: job payloads, errors, queue and type names, worker ids -- all user data --
are escaped wherever a template puts them. Nothing in Python builds HTML, and no
template marks a value ``|safe``. Undefined names are errors, not empty strings, so
a typo in a template fails its test instead of hiding a field.
"""

from __future__ import annotations

from typing import Any

from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape
from starlette.requests import Request
from starlette.responses import HTMLResponse

from deadman.api.ui import display

ENV = Environment(
    loader=PackageLoader("deadman.api.ui", "templates"),
    autoescape=select_autoescape(["html"], default_for_string=True, default=True),
    undefined=StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)
#: Sent with every page. The POST buttons must not be clickable inside another site's
#: frame (clickjacking a "replay every dead job"); the pages hold job data, so no
#: cache keeps them; the referrer (job ids in paths) stays on this site.
HEADERS = {
    "Content-Security-Policy": "frame-ancestors 'none'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}
ENV.filters.update(ago=display.ago, error_line=display.error_line, pretty_json=display.pretty_json)
ENV.globals.update(url=display.url, took=display.took)


def page(request: Request, template: str, status: int = 200, **context: Any) -> HTMLResponse:
    """``template`` rendered with ``context``; ``signed_in`` says whether to offer a
    sign-out (only a session can sign out: a Bearer header is not ours to drop)."""
    signed_in = getattr(request.state, "ui_via", None) == "session"
    html = ENV.get_template(template).render(signed_in=signed_in, **context)
    return HTMLResponse(html, status_code=status, headers=HEADERS)


def message(request: Request, title: str, text: str, status: int) -> HTMLResponse:
    """A short page that says one thing: an error (4xx) or an action's outcome."""
    return page(request, "message.html", status, title=title, message=text)
