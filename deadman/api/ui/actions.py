"""The dashboard's POST actions: replay, cancel, bulk replay, pause and resume.

Each runs the store method the JSON API runs, then redirects to the page that shows
the outcome (or says it on a short page). ``guarded`` has already checked the
credentials and that the form came from one of our pages.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from deadman.api.state import api_state
from deadman.api.ui.guard import guarded, read_form
from deadman.api.ui.pages import path_id
from deadman.api.ui.render import message, page
from deadman.errors import InvalidJob
from deadman.model import validate_queue, validate_type


@guarded
async def retry(request: Request) -> Response:
    """Replay one dead (or cancelled) job, then show it (its page refreshes itself)."""
    job_id = path_id(request)
    await api_state(request).store.job_retry(job_id)
    return RedirectResponse(f"/ui/jobs/{job_id}", status_code=303)


@guarded
async def cancel(request: Request) -> Response:
    job_id = path_id(request)
    await api_state(request).store.job_cancel(job_id)
    return RedirectResponse(f"/ui/jobs/{job_id}", status_code=303)


@guarded
async def replay_bulk(request: Request) -> Response:
    form = await read_form(request, frozenset({"type", "queue"}))
    try:
        type_ = validate_type(form["type"]) if form.get("type") else None
        queue = validate_queue(form["queue"]) if form.get("queue") else None
    except InvalidJob as exc:
        return message(request, "bad filter", str(exc), 422)
    ids = await api_state(request).store.job_retry_dead_many(type_, queue)
    return page(request, "replayed.html", title="replayed", count=len(ids), type=type_, queue=queue)


@guarded
async def set_paused(request: Request) -> Response:
    action = request.path_params["action"]
    try:
        name = validate_queue(str(request.path_params["name"]))
    except InvalidJob as exc:
        return message(request, "bad queue", str(exc), 422)
    if action not in ("pause", "resume"):
        return message(request, "not found", "no such action", 404)
    await api_state(request).store.queue_set_paused(name, action == "pause")
    return RedirectResponse("/ui/", status_code=303)
