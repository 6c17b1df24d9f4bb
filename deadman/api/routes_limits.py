"""The flow-control endpoints: ``PUT|GET|DELETE /limits/{key}`` and ``GET /limits``."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from deadman.api import schema
from deadman.api.problems import Problem, deleted
from deadman.api.serialize import limit_json
from deadman.api.state import api_state
from deadman.spec import LimitSpec


def _key(request: Request) -> str:
    return schema.parse_name(request.path_params["key"], "key")


async def put_limit(request: Request) -> Response:
    """Create or replace a key's limit: 200 with it (it applies from the next claim)."""
    key = _key(request)
    spec = schema.parse_spec(LimitSpec, await schema.read_json(request))
    return JSONResponse(limit_json(await api_state(request).store.limit_put(spec.params(key))))


async def get_limit(request: Request) -> Response:
    key = _key(request)
    found = await api_state(request).store.limit_get(key)
    if found is None:
        raise Problem("not-found", f"no limit for key {key}")
    return JSONResponse(limit_json(found))


async def delete_limit(request: Request) -> Response:
    """204; 404 when the key has no limit. Its jobs run unlimited from the next claim."""
    key = _key(request)
    return deleted(await api_state(request).store.limit_delete(key), f"no limit for key {key}")


async def list_limits(request: Request) -> Response:
    limits = await api_state(request).store.limit_list()
    return JSONResponse({"limits": [limit_json(x) for x in limits]})


ROUTES = [
    Route("/limits", list_limits, methods=["GET"]),
    Route("/limits/{key}", put_limit, methods=["PUT"]),
    Route("/limits/{key}", get_limit, methods=["GET"]),
    Route("/limits/{key}", delete_limit, methods=["DELETE"]),
]
