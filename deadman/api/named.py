"""The routes every named resource shares (limits, schedules, queues): its list, and GET,
DELETE, pause and resume by the name in its path, with 404 when there is none.

A resource says how it is addressed and shown (:class:`Named`) and which store method
each route runs; the name in the path is checked here, once for all of them (422 naming
the path parameter unless it is a name). What differs between resources, a PUT's
body and status, stays in their own modules.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from deadman.api import schema
from deadman.api.problems import Problem, deleted
from deadman.api.state import api_state
from deadman.store import AsyncStore

T = TypeVar("T")
Endpoint = Callable[[Request], Awaitable[Response]]


@dataclass(frozen=True)
class Named(Generic[T]):
    """A kind of resource addressed by a name: ``/<plural>`` lists them (under the
    field ``<plural>``), ``/<plural>/{<param>}`` is one; ``render`` is its JSON."""

    plural: str
    param: str
    #: the 404's detail, before the name: "no limit for key", "no schedule"
    missing: str
    render: Callable[[T], dict[str, Any]]

    @property
    def item(self) -> str:
        """The path of one: ``/limits/{key}``."""
        return f"/{self.plural}/{{{self.param}}}"

    def name(self, request: Request) -> str:
        return schema.parse_name(request.path_params[self.param], self.param)

    def found(self, name: str, item: T | None) -> Response:
        """200 with ``item``, or 404 when there is none of that name."""
        if item is None:
            raise Problem("not-found", f"{self.missing} {name}")
        return JSONResponse(self.render(item))

    def list_route(self, fetch: Callable[[AsyncStore], Awaitable[Sequence[T]]]) -> Route:
        async def listed(request: Request) -> Response:
            items = await fetch(api_state(request).store)
            return JSONResponse({self.plural: [self.render(x) for x in items]})

        return Route(f"/{self.plural}", listed, methods=["GET"])

    def get_route(self, fetch: Callable[[AsyncStore, str], Awaitable[T | None]]) -> Route:
        async def get(request: Request) -> Response:
            name = self.name(request)
            return self.found(name, await fetch(api_state(request).store, name))

        return Route(self.item, get, methods=["GET"])

    def delete_route(self, remove: Callable[[AsyncStore, str], Awaitable[bool]]) -> Route:
        """204, or 404 when there was none of that name."""

        async def delete(request: Request) -> Response:
            name = self.name(request)
            removed = await remove(api_state(request).store, name)
            return deleted(removed, f"{self.missing} {name}")

        return Route(self.item, delete, methods=["DELETE"])

    def pause_routes(
        self, set_paused: Callable[[AsyncStore, str, bool], Awaitable[T | None]]
    ) -> list[Route]:
        """``POST .../pause`` and ``.../resume``: the resource as it now stands."""

        def setting(paused: bool) -> Endpoint:
            async def endpoint(request: Request) -> Response:
                name = self.name(request)
                return self.found(name, await set_paused(api_state(request).store, name, paused))

            return endpoint

        return [
            Route(f"{self.item}/{action}", setting(action == "pause"), methods=["POST"])
            for action in ("pause", "resume")
        ]
