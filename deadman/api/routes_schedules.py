"""The schedule endpoints: ``PUT|GET|DELETE /schedules/{name}``, ``GET /schedules``,
``POST /schedules/{name}/pause|resume``."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from deadman.api import schema
from deadman.api.problems import Problem, deleted
from deadman.api.serialize import schedule_json
from deadman.api.state import api_state
from deadman.spec import ScheduleSpec
from deadman.store.schedules import Schedule


def _name(request: Request) -> str:
    return schema.parse_name(request.path_params["name"], "name")


def _found(name: str, schedule: Schedule | None) -> Schedule:
    if schedule is None:
        raise Problem("not-found", f"no schedule {name}")
    return schedule


async def put_schedule(request: Request) -> Response:
    """201 when it creates the schedule, 200 when it replaces one (which keeps its
    paused flag and what it last fired); its next tick is counted from now."""
    name = _name(request)
    spec = schema.parse_spec(ScheduleSpec, await schema.read_json(request))
    store = api_state(request).store
    schedule = await store.schedule_put(spec.params(name, await store.db_now()))
    return JSONResponse(schedule_json(schedule), 201 if schedule.created else 200)


async def get_schedule(request: Request) -> Response:
    name = _name(request)
    return JSONResponse(
        schedule_json(_found(name, await api_state(request).store.schedule_get(name)))
    )


async def delete_schedule(request: Request) -> Response:
    name = _name(request)
    return deleted(await api_state(request).store.schedule_delete(name), f"no schedule {name}")


async def list_schedules(request: Request) -> Response:
    schedules = await api_state(request).store.schedule_list()
    return JSONResponse({"schedules": [schedule_json(s) for s in schedules]})


async def pause_schedule(request: Request) -> Response:
    return await _set_paused(request, True)


async def resume_schedule(request: Request) -> Response:
    return await _set_paused(request, False)


async def _set_paused(request: Request, paused: bool) -> Response:
    name = _name(request)
    found = await api_state(request).store.schedule_set_paused(name, paused)
    return JSONResponse(schedule_json(_found(name, found)))


ROUTES = [
    Route("/schedules", list_schedules, methods=["GET"]),
    Route("/schedules/{name}", put_schedule, methods=["PUT"]),
    Route("/schedules/{name}", get_schedule, methods=["GET"]),
    Route("/schedules/{name}", delete_schedule, methods=["DELETE"]),
    Route("/schedules/{name}/pause", pause_schedule, methods=["POST"]),
    Route("/schedules/{name}/resume", resume_schedule, methods=["POST"]),
]
