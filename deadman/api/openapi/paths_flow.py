"""The paths of the OpenAPI document for workflows and flow-control limits (the job,
queue and probe paths are in paths.py)."""

from __future__ import annotations

from typing import Any

from deadman.api.openapi.common import _json, _keyed_create, _queue_name_param, _ref
from deadman.api.openapi.paths import _BY_NAME, _FOUND_OR_NOT, _READ, _op
from deadman.bounds import ID_PATTERN


def _workflow_paths() -> dict[str, Any]:
    wf = _ref("Workflow")
    wf_id = {
        "name": "id",
        "in": "path",
        "required": True,
        "schema": {"type": "string", "pattern": ID_PATTERN},
    }
    return {
        "/workflows": {
            "post": {
                "operationId": "createWorkflow",
                "summary": "Submit a workflow (a DAG of jobs)",
                "description": "Every node is created in one transaction. Nodes with "
                "dependencies are `waiting` until all of them succeeded; when one ends dead "
                "or cancelled, everything downstream is cancelled (`upstream <name> "
                "<state>`). With `Idempotency-Key`, as for `POST /jobs`: the same key and "
                "the same workflow again is 200 with the same workflow and "
                "`Idempotent-Replayed: true`; a different workflow is 422.",
                **_keyed_create("WorkflowSpec", "Workflow", "/workflows/{id}", "workflow"),
            }
        },
        "/workflows/{id}": {
            "get": _op(
                "getWorkflow",
                "A workflow's state and each node's state",
                {"200": _json(wf, "The workflow.")},
                *_FOUND_OR_NOT,
                parameters=[wf_id],
            )
        },
        "/workflows/{id}/cancel": {
            "post": _op(
                "cancelWorkflow",
                "Cancel every unfinished node",
                {
                    "200": _json(wf, "Finished."),
                    "202": _json(wf, "Cancellation requested from running nodes."),
                },
                *_FOUND_OR_NOT,
                description="200 when the workflow is finished (now or before); 202 "
                "while running nodes are being told to stop.",
                parameters=[wf_id],
            )
        },
    }


def _limit_paths() -> dict[str, Any]:
    return {
        "/limits": {
            "get": _op(
                "listLimits",
                "Every flow-control limit and its live state, by key",
                {"200": _json(_ref("Limits"), "The limits (at most 1000).")},
                *_READ,
            )
        },
        "/limits/{key}": {
            "put": _op(
                "putLimit",
                "Create or replace a key's limit",
                {"200": _json(_ref("Limit"), "The limit, as it now stands.")},
                "MalformedJson",
                "ContentTooLarge",
                "UnsupportedMediaType",
                *_BY_NAME,
                description="At most `concurrency` jobs with `limit_key` = key run at once "
                "across the fleet, and at most `rate.count` of them start in any window of "
                "`rate.per_ms` ms. It applies from the next claim. A key without a limit "
                "runs unlimited.",
                parameters=[_queue_name_param("key")],
                requestBody={
                    "required": True,
                    "content": {"application/json": {"schema": _ref("LimitSpec")}},
                },
            ),
            "get": _op(
                "getLimit",
                "One key's limit and its live state",
                {"200": _json(_ref("Limit"), "The limit.")},
                "NotFound",
                *_BY_NAME,
                parameters=[_queue_name_param("key")],
            ),
            "delete": _op(
                "deleteLimit",
                "Remove a key's limit (its jobs run unlimited from the next claim)",
                {"204": {"description": "Removed."}},
                "NotFound",
                *_BY_NAME,
                parameters=[_queue_name_param("key")],
            ),
        },
    }


def _schedule_paths() -> dict[str, Any]:
    name = [_queue_name_param("name")]
    schedule = _ref("Schedule")
    return {
        "/schedules": {
            "get": _op(
                "listSchedules",
                "Every schedule, its next and last fire time, by name",
                {"200": _json(_ref("Schedules"), "The schedules (at most 1000).")},
                *_READ,
            )
        },
        "/schedules/{name}": {
            "put": _op(
                "putSchedule",
                "Create or replace a schedule",
                {
                    "201": _json(schedule, "Created."),
                    "200": _json(schedule, "Replaced (paused and last fire kept)."),
                },
                "MalformedJson",
                "ContentTooLarge",
                "UnsupportedMediaType",
                *_BY_NAME,
                description="Each tick of `cron` (in `timezone`) or of `every_ms` (since the "
                "Unix epoch) enqueues `job` once, with the idempotency key "
                "`schedule:<name>:<tick, RFC 3339 UTC>`, across any number of workers. After "
                "downtime `latest` enqueues the most recent missed tick once, `none` skips "
                "to the next; never a burst.",
                parameters=name,
                requestBody={
                    "required": True,
                    "content": {"application/json": {"schema": _ref("ScheduleSpec")}},
                },
            ),
            "get": _op(
                "getSchedule",
                "One schedule",
                {"200": _json(schedule, "The schedule.")},
                "NotFound",
                *_BY_NAME,
                parameters=name,
            ),
            "delete": _op(
                "deleteSchedule",
                "Remove a schedule (the jobs it made stay)",
                {"204": {"description": "Removed."}},
                "NotFound",
                *_BY_NAME,
                parameters=name,
            ),
        },
        **{
            f"/schedules/{{name}}/{action}": {
                "post": _op(
                    f"{action}Schedule",
                    summary,
                    {"200": _json(schedule, "The schedule.")},
                    "NotFound",
                    *_BY_NAME,
                    parameters=name,
                )
            }
            for action, summary in (
                ("pause", "Stop firing a schedule's ticks"),
                ("resume", "Fire again from the next tick (the ones slept through are missed)"),
            )
        },
    }
