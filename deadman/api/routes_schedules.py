"""The schedule endpoints: ``PUT|GET|DELETE /schedules/{name}``, ``GET /schedules``,
``POST /schedules/{name}/pause|resume``."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from deadman.api import schema
from deadman.api.named import Named
from deadman.api.serialize import schedule_json
from deadman.api.state import api_state
from deadman.spec import ScheduleSpec
from deadman.store import AsyncStore
from deadman.store.schedules import Schedule

SCHEDULES = Named[Schedule]("schedules", "name", "no schedule", schedule_json)


async def put_schedule(request: Request) -> Response:
    """201 when it creates the schedule, 200 when it replaces one (which keeps its
    paused flag and what it last fired); its next tick is counted from now."""
    name = SCHEDULES.name(request)
    spec = schema.parse_spec(ScheduleSpec, await schema.read_json(request))
    store = api_state(request).store
    schedule = await store.schedule_put(spec.params(name, await store.db_now()))
    return JSONResponse(schedule_json(schedule), 201 if schedule.created else 200)


ROUTES = [
    SCHEDULES.list_route(AsyncStore.schedule_list),
    Route(SCHEDULES.item, put_schedule, methods=["PUT"]),
    SCHEDULES.get_route(AsyncStore.schedule_get),
    # The jobs a deleted schedule made stay.
    SCHEDULES.delete_route(AsyncStore.schedule_delete),
    *SCHEDULES.pause_routes(AsyncStore.schedule_set_paused),
]
