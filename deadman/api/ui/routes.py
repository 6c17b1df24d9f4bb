"""The dashboard's routes, mounted at ``/ui`` by ``create_app``.

Server-rendered HTML (Jinja2 templates in ``templates/``, see render.py) over the
same store methods as the JSON API; a little vanilla JS only re-fetches the page
for auto-refresh. Pages are in pages.py, actions in actions.py, sign-in in
signin.py, the credential and CSRF checks in guard.py.
"""

from __future__ import annotations

from starlette.routing import Route

from deadman.api.ui import actions, pages, signin

ROUTES = [
    Route("/", pages.overview, methods=["GET"]),
    Route("/login", signin.login_form, methods=["GET"]),
    Route("/login", signin.login, methods=["POST"]),
    Route("/logout", signin.logout, methods=["POST"]),
    Route("/jobs", pages.jobs, methods=["GET"]),
    Route("/jobs/{id}", pages.job_page, methods=["GET"]),
    *actions.JOB_ROUTES,
    Route("/dead", pages.dead, methods=["GET"]),
    Route("/dead/replay", actions.replay_bulk, methods=["POST"]),
    Route("/workers", pages.workers, methods=["GET"]),
    Route("/queues/{name}/{action}", actions.set_paused, methods=["POST"]),
]
