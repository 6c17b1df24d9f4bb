"""The flow-control endpoints: ``PUT|GET|DELETE /limits/{key}`` and ``GET /limits``."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from deadman.api import schema
from deadman.api.named import Named
from deadman.api.serialize import limit_json
from deadman.api.state import api_state
from deadman.spec import LimitSpec
from deadman.store import AsyncStore
from deadman.store.limits import Limit

LIMITS = Named[Limit]("limits", "key", "no limit for key", limit_json)


async def put_limit(request: Request) -> Response:
    """Create or replace a key's limit: 200 with it (it applies from the next claim)."""
    key = LIMITS.name(request)
    spec = schema.parse_spec(LimitSpec, await schema.read_json(request))
    return JSONResponse(limit_json(await api_state(request).store.limit_put(spec.params(key))))


ROUTES = [
    LIMITS.list_route(AsyncStore.limit_list),
    Route(LIMITS.item, put_limit, methods=["PUT"]),
    LIMITS.get_route(AsyncStore.limit_get),
    # A deleted key's jobs run unlimited from the next claim.
    LIMITS.delete_route(AsyncStore.limit_delete),
]
