"""The paths of the OpenAPI document for workflows and the named resources, flow-control
limits and schedules (the job, queue and probe paths are in paths.py)."""

from __future__ import annotations

from typing import Any

from deadman.api.openapi.common import _FOUND_BY_NAME, _FOUND_OR_NOT, _json, _keyed_create, _ref
from deadman.api.openapi.operations import _named_paths, _ok, _op, _pause_resume
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
    return _named_paths(
        "Limit",
        "key",
        {
            "list": "Every flow-control limit and its live state, by key",
            "put": "Create or replace a key's limit",
            "get": "One key's limit and its live state",
            "delete": "Remove a key's limit (its jobs run unlimited from the next claim)",
        },
        _ok(_ref("Limit"), "The limit, as it now stands."),
        "At most `concurrency` jobs with `limit_key` = key run at once across the fleet, "
        "and at most `rate.count` of them start in any window of `rate.per_ms` ms. It "
        "applies from the next claim. A key without a limit runs unlimited.",
    )


def _schedule_paths() -> dict[str, Any]:
    schedule = _ref("Schedule")
    named = _named_paths(
        "Schedule",
        "name",
        {
            "list": "Every schedule, its next and last fire time, by name",
            "put": "Create or replace a schedule",
            "get": "One schedule",
            "delete": "Remove a schedule (the jobs it made stay)",
        },
        {
            "201": _json(schedule, "Created."),
            "200": _json(schedule, "Replaced (paused and last fire kept)."),
        },
        "Each tick of `cron` (in `timezone`) or of `every_ms` (since the Unix epoch) "
        "enqueues `job` once, with the idempotency key `schedule:<name>:<tick, RFC 3339 "
        "UTC>`, across any number of workers. After downtime `latest` enqueues the most "
        "recent missed tick once, `none` skips to the next; never a burst.",
    )
    return {
        **named,
        **_pause_resume(
            "Schedule",
            _FOUND_BY_NAME,
            ("Stop firing a schedule's ticks", "The schedule.", None),
            (
                "Fire again from the next tick (the ones slept through are missed)",
                "The schedule.",
                None,
            ),
        ),
    }
