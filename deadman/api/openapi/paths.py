"""The paths of the OpenAPI document: every operation, its parameters, bodies and
answers, and the links between operations that the stateful schemathesis run walks."""

from __future__ import annotations

import re
from typing import Any

from deadman.api import schema
from deadman.api.openapi.common import (
    _ACTION,
    _BY_NAME,
    _CREATE_ERRORS,
    _FOUND_OR_NOT,
    _NAME,
    _READ,
    STATES,
    _body,
    _json,
    _keyed_create,
    _ref,
)
from deadman.api.openapi.operations import _listing, _ok, _on_job, _op, _pause_resume
from deadman.bounds import ID_PATTERN, LIST_WINDOW, WAIT_MS_MAX
from deadman.store import FINISHED_COUNT_CAP


def _paths() -> dict[str, Any]:
    job = _ref("Job")
    replayed = {"required": True, "schema": {"const": "true"}}
    return {
        "/jobs": {
            "post": {
                "operationId": "createJob",
                "summary": "Submit a job",
                "description": "201 after the insert committed. With `Idempotency-Key` "
                '(IETF draft; a structured-field string `"key"` or the bare key): the same '
                "key and the same request again is 200 with the same job and "
                "`Idempotent-Replayed: true`; the same key with a different request is 422. "
                "Concurrent identical requests create one job; every caller gets its id. A "
                "key lives as long as its job.",
                **_keyed_create("JobSpec", "Job", "/jobs/{id}", "job"),
            },
            "get": _op(
                "listJobs",
                "List jobs, newest first",
                _ok(_ref("JobPage"), "A page of jobs."),
                *_BY_NAME,
                description="Keyset pagination: pass `next_cursor` back as `cursor` until it "
                "is null. Filtered by a state other than `succeeded`, or not filtered, a page "
                "is served by an index and is full unless it is the last. Filtered by `queue` "
                "or `type` without a state (or with `succeeded`), a page looks through a "
                f"window of the {LIST_WINDOW:,} jobs below its cursor: it may hold "
                "fewer jobs than `limit` (even none) while `next_cursor` leads to older ones.",
                parameters=[
                    {"name": "state", "in": "query", "schema": {"enum": STATES}},
                    {"name": "type", "in": "query", "schema": _NAME},
                    {"name": "queue", "in": "query", "schema": _NAME},
                    {
                        "name": "limit",
                        "in": "query",
                        "schema": {
                            "type": "integer",
                            "minimum": 1,
                            "maximum": schema.LIMIT_MAX,
                            "default": schema.LIMIT_DEFAULT,
                        },
                    },
                    {
                        "name": "cursor",
                        "in": "query",
                        "description": "Opaque: a `next_cursor` from a previous page.",
                        "schema": {"type": "string", "pattern": ID_PATTERN},
                    },
                ],
            ),
        },
        "/jobs/batch": {
            "post": _op(
                "createJobs",
                "Submit up to 1000 jobs, all or none",
                {
                    "201": _json(_ref("Jobs"), "Created (in request order)."),
                    "200": _json(
                        _ref("Jobs"),
                        "Every item was a replay.",
                        **{"Idempotent-Replayed": replayed},
                    ),
                },
                *_CREATE_ERRORS,
                description="One transaction. Items may carry `idempotency_key` (the "
                "Idempotency-Key header is refused here): a replayed item returns its "
                "existing job; a key used for a different request fails the whole batch "
                "(422, nothing created). 201 if any job was created; 200 with "
                "`Idempotent-Replayed: true` if all were replays. With "
                "DEADMAN_MAX_QUEUE_DEPTH, 429 if the batch would take a queue past it.",
                requestBody=_body("BatchSpec"),
            )
        },
        "/jobs/{id}": {
            "get": _on_job(
                "getJob",
                "One job",
                _ok(job, "The job: as it is, or once it ended (see wait_ms)."),
                "Unprocessable",
                *_FOUND_OR_NOT,
                description="With `wait_ms`, a long-poll: answered as soon as the job is "
                "succeeded, dead or cancelled (woken by a notification, polled every "
                "second as a fallback), or after `wait_ms` milliseconds with the job as it "
                "is then. 200 either way: its `state` says whether it ended.",
                query=(
                    {
                        "name": "wait_ms",
                        "in": "query",
                        "description": "Wait up to this long for the job to end; 0: "
                        "answer at once. At most once.",
                        "schema": {
                            "type": "integer",
                            "minimum": 0,
                            "maximum": WAIT_MS_MAX,
                            "default": 0,
                        },
                    },
                ),
            )
        },
        "/jobs/{id}/attempts": {
            "get": _on_job(
                "getJobAttempts",
                "A job's ended attempts, oldest first",
                _ok(_ref("Attempts"), "The history."),
                *_FOUND_OR_NOT,
                description="A running attempt is not listed yet: it is the job's lease.",
            )
        },
        "/jobs/{id}/cancel": {
            "post": _on_job(
                "cancelJob",
                "Cancel a job",
                {
                    "200": _json(job, "Cancelled."),
                    "202": _json(job, "Running; cancellation requested."),
                },
                *_ACTION,
                description="Not yet running: cancelled at once (200). Running: 202, "
                "cancellation requested; the worker hears it at once by NOTIFY (or at its "
                "next heartbeat at the latest) and stops the handler. Already finished "
                "(a handler that completed first stays succeeded): 409.",
            )
        },
        "/jobs/{id}/retry": {
            "post": _on_job(
                "retryJob",
                "Replay a dead or cancelled job",
                _ok(job, "Queued again."),
                *_ACTION,
                description="Back to queued, due now, with a fresh set of attempts; the "
                "attempt history is kept. Any other state: 409.",
            )
        },
        **_listing(
            "Queue",
            "Queues with their unfinished jobs by state",
            "The queues, by name.",
            description="Every queue with unfinished jobs or that was "
            "paused/resumed. Counts are exact and read only unfinished rows, so they "
            "cost in proportion to the backlog, not to the finished jobs retention "
            "keeps; finished jobs are counted in total by GET /stats.",
        ),
        **_pause_resume(
            "Queue",
            _BY_NAME,
            (
                "Stop workers claiming from a queue",
                "Paused.",
                "Running jobs finish; submissions are still accepted. A queue can be paused "
                "before it has jobs.",
            ),
            ("Let workers claim from a queue again", "Resumed.", None),
        ),
        **_listing(
            "Worker",
            "Registered workers, their last heartbeat and jobs held",
            "The workers, by id.",
        ),
        "/stats": {
            "get": _op(
                "getStats",
                "Job counts by state in total, unfinished ones per queue",
                _ok(_ref("Stats"), "The counts."),
                *_READ,
                description="Unfinished states are exact (as GET /queues). Finished "
                f"states (succeeded, dead, cancelled) are counted exactly up to "
                f"{FINISHED_COUNT_CAP} each "
                "and estimated beyond (pg_class.reltuples x pg_stats frequency, as fresh "
                "as the last ANALYZE): `estimated` names those states. Never scans the "
                "table, however many finished jobs it holds.",
            )
        },
        "/health": {
            "get": _op(
                "health",
                "The process is up (no auth, no database)",
                {
                    "200": _json(
                        {
                            "type": "object",
                            "properties": {"status": {"const": "ok"}},
                            "required": ["status"],
                        },
                        "Up.",
                    )
                },
                security=[],
            )
        },
        "/ready": {
            "get": _op(
                "ready",
                "The database answers and its schema is current",
                {
                    "200": _json(
                        {
                            "type": "object",
                            "properties": {
                                "status": {"const": "ready"},
                                "schema_version": {"type": "integer"},
                            },
                            "required": ["status", "schema_version"],
                        },
                        "Ready.",
                    )
                },
                *_READ,
            )
        },
        "/metrics": {
            "get": _op(
                "metrics",
                "Prometheus metrics",
                {
                    "200": {
                        "description": "Prometheus text format.",
                        "content": {"text/plain": {"schema": {"type": "string"}}},
                    }
                },
                "Unauthorized",
                description="This process's metrics, plus `deadman_jobs{queue,state}` "
                "gauges counted at scrape time (the cost note of GET /queues applies: "
                "scrape every 15 s or more, not every second) and "
                "`deadman_api_database_up`. A database outage does not fail the scrape.",
            )
        },
        "/openapi.json": {
            "get": _op(
                "openapi",
                "This document",
                _ok({"type": "object"}, "OpenAPI 3.1."),
                "Unauthorized",
            )
        },
    }


#: OpenAPI links (section 4.8.20): which operation can follow which, with the id it
#: takes from the response. They document the life of a job for client authors, and
#: they are what the stateful schemathesis run walks: create -> get -> cancel ->
#: retry -> get, on real ids, not only on generated ones that name no job.
#: (path, method, statuses) -> {link name: (operationId, runtime expression)}.
_JOB_ID = "$response.body#/id"
_FIRST_JOB_ID = "$response.body#/jobs/0/id"
_FIRST_NODE_JOB_ID = "$response.body#/nodes/0/job_id"
Links = dict[str, tuple[str, str]]


def _links(expression: str, *operations: str, infix: str = "") -> Links:
    """Links to ``operations`` taking the id at ``expression``; each named after its
    operation, ``infix`` after the verb: cancelJob -> CancelJob, or CancelFirstJob."""
    named: Links = {}
    for op in operations:
        verb = re.match(r"[a-z]+", op)
        assert verb is not None
        name = op[: verb.end()].capitalize() + infix + op[verb.end() :]
        named[name] = (op, expression)
    return named


_CREATED = ("200", "201")
_CHANGED = ("200", "202")
LINKS: dict[tuple[str, str, tuple[str, ...]], Links] = {
    ("/jobs", "post", _CREATED): _links(
        _JOB_ID, "getJob", "getJobAttempts", "cancelJob", "retryJob"
    ),
    ("/jobs/batch", "post", _CREATED): _links(_FIRST_JOB_ID, "getJob", "cancelJob", infix="First"),
    ("/jobs/{id}", "get", ("200",)): _links(_JOB_ID, "cancelJob", "retryJob"),
    ("/jobs/{id}/cancel", "post", _CHANGED): _links(_JOB_ID, "getJob", "retryJob"),
    ("/jobs/{id}/retry", "post", ("200",)): _links(_JOB_ID, "getJob", "cancelJob"),
    ("/workflows", "post", _CREATED): {
        **_links(_JOB_ID, "getWorkflow", "cancelWorkflow"),
        **_links(_FIRST_NODE_JOB_ID, "getJob", "cancelJob", infix="FirstNode"),
    },
    ("/workflows/{id}/cancel", "post", _CHANGED): _links(_JOB_ID, "getWorkflow"),
}


def _with_links(paths: dict[str, Any]) -> dict[str, Any]:
    for (path, method, statuses), links in LINKS.items():
        for status in statuses:
            response = paths[path][method]["responses"][status]
            response["links"] = {
                name: {"operationId": operation, "parameters": {"path.id": expression}}
                for name, (operation, expression) in links.items()
            }
    return paths
