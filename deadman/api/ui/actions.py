"""The dashboard's POST actions: replay, cancel, bulk replay, pause and resume.

Each runs the store method the JSON API runs, then redirects to the page that shows
the outcome (or says it on a short page). ``guarded`` has already checked the
credentials and that the form came from one of our pages.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from deadman.api.state import api_state
from deadman.api.ui.guard import Handler, guarded, read_form
from deadman.api.ui.pages import path_id
from deadman.api.ui.render import message, page
from deadman.errors import InvalidJob
from deadman.model import validate_queue, validate_type
from deadman.store import AsyncStore

#: The job page's buttons, by the last step of their path: each runs the store method
#: the JSON API's POST /jobs/{id}/<action> runs. retry replays a dead (or cancelled)
#: job; cancel stops it (or asks its worker to).
_JOB_ACTIONS: dict[str, Callable[[AsyncStore, int], Awaitable[object]]] = {
    "retry": AsyncStore.job_retry,
    "cancel": AsyncStore.job_cancel,
}


def _on_job(run: Callable[[AsyncStore, int], Awaitable[object]]) -> Handler:
    @guarded
    async def action(request: Request) -> Response:
        """Run the action, then show the job (its page refreshes itself)."""
        job_id = path_id(request)
        await run(api_state(request).store, job_id)
        return RedirectResponse(f"/ui/jobs/{job_id}", status_code=303)

    return action


#: A route each, as in the JSON API: an unknown action matches no route (the app's 404),
#: and each has its own route label in the request metrics.
JOB_ROUTES = [
    Route(f"/jobs/{{id}}/{name}", _on_job(run), methods=["POST"])
    for name, run in _JOB_ACTIONS.items()
]


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
