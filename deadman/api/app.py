"""``create_app``: the Starlette application, its middleware and its lifespan.

The app is stateless: everything lives in Postgres, so any number of servers can
serve one database. Its pool opens in the lifespan *without waiting* for a first
connection: a server started while the database is down still comes up, answers
``/health``, and says 503 on ``/ready`` and on anything needing the database until
the pool's background reconnection succeeds. Nothing here blocks the event loop:
all database work goes through the async store.

Requests pass, outermost first: Starlette's error middleware (the last-resort 500
problem) -> request metrics -> bearer auth (before any body is read) -> the
dashboard's signed sessions (``/ui`` only) -> body size limit -> exception handlers
(problems) -> the routes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.middleware import Middleware

from deadman.api import (
    routes_jobs,
    routes_limits,
    routes_ops,
    routes_schedules,
    routes_workflows,
    ui,
)
from deadman.api.auth import BearerAuth, DashboardSessions
from deadman.api.group_commit import GroupCommit
from deadman.api.limits import BodyLimit
from deadman.api.problems import EXCEPTION_HANDLERS
from deadman.api.state import ApiState
from deadman.api.telemetry import RequestMetrics
from deadman.config import Settings
from deadman.db.migrate import latest_version
from deadman.db.pool import async_pool
from deadman.loopwatch import LoopWatch
from deadman.store import AsyncStore
from deadman.waiting import AsyncWaiter

#: How long a request waits for a pooled connection before it is answered 503.
POOL_TIMEOUT_S = 5.0
POOL_MAX_SIZE = 10


def create_app(
    settings: Settings,
    dsn: str,
    *,
    pool_timeout_s: float = POOL_TIMEOUT_S,
    pool_max_size: int | None = None,
) -> Starlette:
    """The API over the database at ``dsn``.

    ``pool_max_size`` defaults to ``DEADMAN_POOL_SIZE`` or 10. The store never
    retries a failed statement (``retry_s=0``): a submission without an idempotency
    key that failed after the server committed it would be inserted twice by a
    retry. The client retries instead, after ``Retry-After``, ideally with a key.
    """
    state = ApiState(settings=settings, schema_version=latest_version())
    max_size = pool_max_size or settings.pool_size or POOL_MAX_SIZE

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        pool = async_pool(dsn, name="deadman-api", max_size=max_size, timeout=pool_timeout_s)
        store = AsyncStore(pool, retry_s=0)
        await store.open(wait=False)
        waiter = AsyncWaiter(dsn, pool=pool)
        submitter = GroupCommit(store, settings.max_attempts)
        state.store, state.waiter, state.submitter = store, waiter, submitter
        watch = LoopWatch()  # every request waits while something blocks the loop
        watch.start()
        try:
            yield
        finally:
            watch.stop()
            state.store = state.waiter = state.submitter = None
            await submitter.close()
            await waiter.close()
            await store.close()

    app = Starlette(
        routes=[
            *routes_jobs.ROUTES,
            *routes_ops.ROUTES,
            *routes_workflows.ROUTES,
            *routes_limits.ROUTES,
            *routes_schedules.ROUTES,
            ui.MOUNT,
        ],
        middleware=[
            Middleware(RequestMetrics),
            Middleware(BearerAuth, token=settings.api_token),
            Middleware(DashboardSessions, token=settings.api_token),
            Middleware(BodyLimit, limit=settings.max_payload_bytes),
        ],
        exception_handlers=EXCEPTION_HANDLERS,
        lifespan=lifespan,
    )
    # "/jobs/1/" is not "/jobs/1": a 404, never a redirect that a client might follow
    # with its body dropped (Starlette redirects such paths by default).
    app.router.redirect_slashes = False
    app.state.deadman = state
    return app
