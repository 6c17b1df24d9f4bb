"""The OpenAPI 3.1 document of the API, served at /openapi.json.

The request bodies are generated from deadman.spec, the models that validate them;
the paths, responses and headers are written here, because the contract is the
product: every status code and header is deliberate. The schemathesis test checks
the server against the whole document (no 5xx, no response that breaks it).
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import Any

from pydantic.json_schema import models_json_schema

from deadman import storable
from deadman.api import schema
from deadman.api.problems import KINDS, TYPE_PREFIX
from deadman.bounds import ID_PATTERN, KEY_MAX_LEN, NAME_PATTERN
from deadman.config import Settings
from deadman.model import AttemptOutcome, JobState
from deadman.spec import BatchSpec, JobSpec, WorkflowSpec
from deadman.store import FINISHED_COUNT_CAP

HEADER_KEY_PATTERN = "^[\\x21-\\x7e]([\\x20-\\x7e]{0,253}[\\x21-\\x7e])?$"
STATES = [s.value for s in JobState]
LIVE_STATES = [s.value for s in JobState if not s.terminal]
TERMINAL_STATES = [s.value for s in JobState if s.terminal]


def _ref(name: str) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema_: dict[str, Any], description: str, **headers: Any) -> dict[str, Any]:
    response: dict[str, Any] = {
        "description": description,
        "content": {"application/json": {"schema": schema_}},
    }
    if headers:
        response["headers"] = headers
    return response


def _responses(*names: str) -> dict[str, Any]:
    """Shared error responses by status code (components/responses)."""
    codes = {
        "MalformedJson": "400",
        "Unauthorized": "401",
        "NotFound": "404",
        "Conflict": "409",
        "ContentTooLarge": "413",
        "UnsupportedMediaType": "415",
        "Unprocessable": "422",
        "QueueFull": "429",
        "Unavailable": "503",
    }
    return {codes[n]: {"$ref": f"#/components/responses/{n}"} for n in names}


_DATETIME = {"type": "string", "format": "date-time"}
_DATETIME_OR_NULL = {"type": ["string", "null"], "format": "date-time"}
_NAME = {"type": "string", "pattern": NAME_PATTERN, "minLength": 1, "maxLength": 128}
_COUNT = {"type": "integer", "minimum": 0}


def _spec_schemas() -> dict[str, Any]:
    """What clients submit, generated from deadman.spec: the same models validate the
    requests, so the document and the server cannot disagree on a bound."""
    _, top = models_json_schema(
        [(m, "validation") for m in (JobSpec, BatchSpec, WorkflowSpec)],
        ref_template="#/components/schemas/{model}",
    )
    defs: dict[str, Any] = top["$defs"]
    return {name: _tidy(schema_) for name, schema_ in defs.items()}


def _tidy(node: Any) -> Any:
    """Without pydantic's generated titles, and without null on the fields that refuse
    it (leaving them out is how a client asks for the default)."""
    if isinstance(node, list):
        return [_tidy(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: _tidy(v) for k, v in node.items() if k != "title" or not isinstance(v, str)}
    options = out.get("anyOf")
    if isinstance(options, list) and len(options) == 2 and {"type": "null"} in options:
        del out["anyOf"]  # a spec.fields.Maybe field: null is refused
        out = {**next(o for o in options if o != {"type": "null"}), **out}
    if out.get("default", 0) is None and ("type" in out or "$ref" in out):
        del out["default"]
    return out


def _workflow_schemas() -> dict[str, Any]:
    return {
        "Workflow": {
            "type": "object",
            "properties": {
                "id": {"type": "string", "pattern": ID_PATTERN},
                "name": {"type": "string"},
                "state": {"enum": ["running", "succeeded", "failed", "cancelled"]},
                "created_at": _DATETIME,
                "finished_at": _DATETIME_OR_NULL,
                "nodes": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "name": {"type": "string"},
                            "job_id": {"type": "string", "pattern": ID_PATTERN},
                            "state": {"enum": STATES},
                            "last_error": {"type": ["string", "null"]},
                        },
                        "required": ["name", "job_id", "state", "last_error"],
                        "additionalProperties": False,
                    },
                },
            },
            "required": ["id", "name", "state", "created_at", "finished_at", "nodes"],
            "additionalProperties": False,
        },
    }


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
            "get": {
                "operationId": "getWorkflow",
                "summary": "A workflow's state and each node's state",
                "parameters": [wf_id],
                "responses": {
                    "200": _json(wf, "The workflow."),
                    **_responses("Unauthorized", "NotFound", "Unavailable"),
                },
            }
        },
        "/workflows/{id}/cancel": {
            "post": {
                "operationId": "cancelWorkflow",
                "summary": "Cancel every unfinished node",
                "description": "200 when the workflow is finished (now or before); 202 "
                "while running nodes are being told to stop.",
                "parameters": [wf_id],
                "responses": {
                    "200": _json(wf, "Finished."),
                    "202": _json(wf, "Cancellation requested from running nodes."),
                    **_responses("Unauthorized", "NotFound", "Unavailable"),
                },
            }
        },
    }


def _schemas() -> dict[str, Any]:
    counts = {
        "type": "object",
        "description": "Number of jobs in each state; every state is present.",
        "properties": {s: _COUNT for s in STATES},
        "required": STATES,
        "additionalProperties": False,
    }
    return {
        "Problem": {
            "type": "object",
            "description": "RFC 9457 problem details. Dispatch on `type`: "
            + ", ".join(f"`{TYPE_PREFIX}{k}` ({v[0]})" for k, v in KINDS.items())
            + ". 422s list every broken field in `errors`.",
            "properties": {
                "type": {"type": "string"},
                "title": {"type": "string"},
                "status": {"type": "integer", "minimum": 400, "maximum": 599},
                "detail": {"type": "string"},
                "errors": {"type": "array", "items": _ref("FieldError")},
            },
            "required": ["type", "title", "status", "detail"],
        },
        "FieldError": {
            "type": "object",
            "properties": {
                "field": {
                    "type": "string",
                    "description": "e.g. `priority`, `backoff.base_ms`, `jobs[3].type`, "
                    "`payload.items[2]`, `Idempotency-Key`; `body` for the body as a whole.",
                },
                "message": {"type": "string"},
            },
            "required": ["field", "message"],
        },
        "Lease": {
            "type": "object",
            "description": "Present while the job is running.",
            "properties": {
                "worker": {"type": "string"},
                "token": {
                    "type": "string",
                    "pattern": "^[0-9]+$",
                    "description": "The fencing token (a bigint, as a string).",
                },
                "expires_at": _DATETIME,
            },
            "required": ["worker", "token", "expires_at"],
            "additionalProperties": False,
        },
        "Job": {
            "type": "object",
            "properties": {
                "id": {
                    "type": "string",
                    "pattern": ID_PATTERN,
                    "description": "A bigint, as a string (JavaScript loses precision above 2^53).",
                },
                "type": {"type": "string"},
                "queue": {"type": "string"},
                "priority": {"type": "integer"},
                "payload": {},
                "state": {"enum": STATES},
                "attempt": {"type": "integer", "minimum": 0},
                "max_attempts": {"type": "integer", "minimum": 1},
                "run_at": _DATETIME,
                "created_at": _DATETIME,
                "started_at": _DATETIME_OR_NULL,
                "finished_at": _DATETIME_OR_NULL,
                "last_error": {"type": ["string", "null"]},
                "idempotency_key": {"type": ["string", "null"]},
                "lease": {"anyOf": [{"type": "null"}, _ref("Lease")]},
                "result": {"description": "What the handler returned (any JSON), or null."},
                "workflow_id": {"type": ["string", "null"], "pattern": ID_PATTERN},
                "node": {"type": ["string", "null"]},
                "start_by": _DATETIME_OR_NULL,
                "deadline": _DATETIME_OR_NULL,
                "heartbeat_timeout_ms": {"type": ["integer", "null"], "minimum": 1},
            },
            "required": [
                "id",
                "type",
                "queue",
                "priority",
                "payload",
                "state",
                "attempt",
                "max_attempts",
                "run_at",
                "created_at",
                "started_at",
                "finished_at",
                "last_error",
                "idempotency_key",
                "lease",
                "result",
                "workflow_id",
                "node",
                "start_by",
                "deadline",
                "heartbeat_timeout_ms",
            ],
            "additionalProperties": False,
        },
        "JobPage": {
            "type": "object",
            "properties": {
                "jobs": {"type": "array", "items": _ref("Job")},
                "next_cursor": {
                    "type": ["string", "null"],
                    "description": "Pass as `cursor` for the next (older) page; null on the last.",
                },
            },
            "required": ["jobs", "next_cursor"],
            "additionalProperties": False,
        },
        "Jobs": {
            "type": "object",
            "properties": {"jobs": {"type": "array", "items": _ref("Job")}},
            "required": ["jobs"],
            "additionalProperties": False,
        },
        "Attempt": {
            "type": "object",
            "properties": {
                "attempt": {"type": "integer"},
                "lease_token": {"type": "string", "pattern": "^[0-9]+$"},
                "worker": {"type": "string"},
                "started_at": _DATETIME,
                "finished_at": _DATETIME,
                "outcome": {"enum": [o.value for o in AttemptOutcome]},
                "error": {"type": ["string", "null"]},
            },
            "required": [
                "attempt",
                "lease_token",
                "worker",
                "started_at",
                "finished_at",
                "outcome",
                "error",
            ],
            "additionalProperties": False,
        },
        "Attempts": {
            "type": "object",
            "properties": {"attempts": {"type": "array", "items": _ref("Attempt")}},
            "required": ["attempts"],
            "additionalProperties": False,
        },
        "Counts": counts,
        "LiveCounts": {
            "type": "object",
            "description": "Exact number of unfinished jobs in each unfinished state; "
            "every such state is present.",
            "properties": {s: _COUNT for s in LIVE_STATES},
            "required": LIVE_STATES,
            "additionalProperties": False,
        },
        "Queue": {
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "paused": {"type": "boolean"},
                "counts": _ref("LiveCounts"),
                "oldest_due_age_s": {
                    "type": ["number", "null"],
                    "minimum": 0,
                    "description": "Seconds the oldest due (claimable) job has waited; "
                    "null when no job is due.",
                },
            },
            "required": ["name", "paused", "counts", "oldest_due_age_s"],
            "additionalProperties": False,
        },
        "Queues": {
            "type": "object",
            "properties": {"queues": {"type": "array", "items": _ref("Queue")}},
            "required": ["queues"],
            "additionalProperties": False,
        },
        "Worker": {
            "type": "object",
            "properties": {
                "id": {"type": "string"},
                "hostname": {"type": "string"},
                "pid": {"type": "integer"},
                "queues": {"type": "array", "items": {"type": "string"}},
                "concurrency": {"type": "integer"},
                "started_at": _DATETIME,
                "last_heartbeat_at": _DATETIME,
                "alive": {
                    "type": "boolean",
                    "description": "Beat within the lease TTL (DEADMAN_LEASE_TTL_S).",
                },
                "jobs_held": {"type": "integer", "minimum": 0},
            },
            "required": [
                "id",
                "hostname",
                "pid",
                "queues",
                "concurrency",
                "started_at",
                "last_heartbeat_at",
                "alive",
                "jobs_held",
            ],
            "additionalProperties": False,
        },
        "Workers": {
            "type": "object",
            "properties": {"workers": {"type": "array", "items": _ref("Worker")}},
            "required": ["workers"],
            "additionalProperties": False,
        },
        "Stats": {
            "type": "object",
            "properties": {
                "jobs": _ref("Counts"),
                "total": _COUNT,
                "estimated": {
                    "type": "array",
                    "items": {"enum": TERMINAL_STATES},
                    "description": "The states whose count in `jobs` is an estimate "
                    "(a finished state with more jobs than the exact-count cap); when "
                    "non-empty, `total` is an estimate too.",
                },
                "queues": {"type": "object", "additionalProperties": _ref("LiveCounts")},
            },
            "required": ["jobs", "total", "estimated", "queues"],
            "additionalProperties": False,
        },
    }


def _problem(description: str, **headers: Any) -> dict[str, Any]:
    response: dict[str, Any] = {
        "description": description,
        "content": {"application/problem+json": {"schema": _ref("Problem")}},
    }
    if headers:
        response["headers"] = headers
    return response


def _retry_after(description: str) -> dict[str, Any]:
    return {"required": True, "description": description, "schema": {"type": "string"}}


def _shared_responses(settings: Settings) -> dict[str, Any]:
    return {
        "MalformedJson": _problem("The body is not JSON (or is empty, or not UTF-8)."),
        "Unauthorized": _problem(
            "DEADMAN_API_TOKEN is set and the request lacks `Authorization: Bearer <token>`.",
            **{
                "WWW-Authenticate": {
                    "required": True,
                    "schema": {"type": "string"},
                    "description": "Bearer",
                }
            },
        ),
        "NotFound": _problem("No such job (malformed ids included), or no such route."),
        "Conflict": _problem("The job's state does not allow this."),
        "ContentTooLarge": _problem(
            f"The body is over DEADMAN_MAX_PAYLOAD_BYTES ({settings.max_payload_bytes} bytes "
            "here); refused without reading it."
        ),
        "UnsupportedMediaType": _problem(
            "The body is not declared as application/json.",
            **{"Accept-Post": {"schema": {"type": "string"}}},
        ),
        "Unprocessable": _problem(
            "The request breaks the schema (`errors` names each field; JSON nested deeper "
            f"than {storable.MAX_DEPTH} levels, \\u0000 and unpaired surrogates included), or "
            "its Idempotency-Key was already used for a different request "
            "(type ...:idempotency-key-reused)."
        ),
        "QueueFull": _problem(
            "DEADMAN_MAX_QUEUE_DEPTH is set and the queue holds that many waiting jobs.",
            **{"Retry-After": _retry_after("Seconds to wait.")},
        ),
        "Unavailable": _problem(
            "The database is unreachable, no pooled connection freed up in time, or the "
            "server is starting/stopping. Transient.",
            **{"Retry-After": _retry_after("Seconds to wait.")},
        ),
    }


def _job_id_param() -> dict[str, Any]:
    return {
        "name": "id",
        "in": "path",
        "required": True,
        "description": "A job id. Malformed and unknown ids are both 404.",
        "schema": {"type": "string", "pattern": ID_PATTERN},
    }


def _queue_name_param() -> dict[str, Any]:
    return {
        "name": "name",
        "in": "path",
        "required": True,
        "schema": {"type": "string", "pattern": NAME_PATTERN},
    }


IDEMPOTENCY_KEY_HEADER: dict[str, Any] = {
    "name": "Idempotency-Key",
    "in": "header",
    "required": False,
    "description": "1-255 visible ASCII characters (spaces only "
    "inside); the same key with a different request is 422.",
    "schema": {
        "type": "string",
        "pattern": HEADER_KEY_PATTERN,
        "minLength": 1,
        "maxLength": KEY_MAX_LEN,
    },
}


#: What a request that creates jobs can be answered besides success: POST /jobs,
#: POST /workflows and POST /jobs/batch alike.
_CREATE_ERRORS = (
    "MalformedJson",
    "Unauthorized",
    "Conflict",
    "ContentTooLarge",
    "UnsupportedMediaType",
    "Unprocessable",
    "QueueFull",
    "Unavailable",
)


def _keyed_create(body: str, made: str, where: str, what: str) -> dict[str, Any]:
    """Parameters, body and responses of a POST that creates under an Idempotency-Key
    (POST /jobs, POST /workflows): 201 created, 200 a replay, the usual problems."""
    location = {"required": True, "schema": {"type": "string"}, "description": where}
    replayed = {"required": True, "schema": {"const": "true"}}
    return {
        "parameters": [IDEMPOTENCY_KEY_HEADER],
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": _ref(body)}},
        },
        "responses": {
            "201": _json(_ref(made), "Created.", Location=location),
            "200": _json(
                _ref(made),
                f"A replay: this key already made this {what} from the same request.",
                Location=location,
                **{"Idempotent-Replayed": replayed},
            ),
            **_responses(*_CREATE_ERRORS),
        },
    }


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
            "get": {
                "operationId": "listJobs",
                "summary": "List jobs, newest first",
                "description": "Keyset pagination: pass `next_cursor` back as `cursor`. Each "
                "filter is served by an index, whatever the table size.",
                "parameters": [
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
                "responses": {
                    "200": _json(_ref("JobPage"), "A page of jobs."),
                    **_responses("Unauthorized", "Unprocessable", "Unavailable"),
                },
            },
        },
        "/jobs/batch": {
            "post": {
                "operationId": "createJobs",
                "summary": "Submit up to 1000 jobs, all or none",
                "description": "One transaction. Items may carry `idempotency_key` (the "
                "Idempotency-Key header is refused here): a replayed item returns its "
                "existing job; a key used for a different request fails the whole batch "
                "(422, nothing created). 201 if any job was created; 200 with "
                "`Idempotent-Replayed: true` if all were replays. With "
                "DEADMAN_MAX_QUEUE_DEPTH, 429 if the batch would take a queue past it.",
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": _ref("BatchSpec")}},
                },
                "responses": {
                    "201": _json(_ref("Jobs"), "Created (in request order)."),
                    "200": _json(
                        _ref("Jobs"),
                        "Every item was a replay.",
                        **{"Idempotent-Replayed": replayed},
                    ),
                    **_responses(*_CREATE_ERRORS),
                },
            }
        },
        "/jobs/{id}": {
            "get": {
                "operationId": "getJob",
                "summary": "One job",
                "parameters": [_job_id_param()],
                "responses": {
                    "200": _json(job, "The job."),
                    **_responses("Unauthorized", "NotFound", "Unavailable"),
                },
            }
        },
        "/jobs/{id}/attempts": {
            "get": {
                "operationId": "getJobAttempts",
                "summary": "A job's ended attempts, oldest first",
                "description": "A running attempt is not listed yet: it is the job's lease.",
                "parameters": [_job_id_param()],
                "responses": {
                    "200": _json(_ref("Attempts"), "The history."),
                    **_responses("Unauthorized", "NotFound", "Unavailable"),
                },
            }
        },
        "/jobs/{id}/cancel": {
            "post": {
                "operationId": "cancelJob",
                "summary": "Cancel a job",
                "description": "Not yet running: cancelled at once (200). Running: 202, "
                "cancellation requested; the worker hears it at once by NOTIFY (or at its "
                "next heartbeat at the latest) and stops the handler. Already finished "
                "(a handler that completed first stays succeeded): 409.",
                "parameters": [_job_id_param()],
                "responses": {
                    "200": _json(job, "Cancelled."),
                    "202": _json(job, "Running; cancellation requested."),
                    **_responses("Unauthorized", "NotFound", "Conflict", "Unavailable"),
                },
            }
        },
        "/jobs/{id}/retry": {
            "post": {
                "operationId": "retryJob",
                "summary": "Replay a dead or cancelled job",
                "description": "Back to queued, due now, with a fresh set of attempts; the "
                "attempt history is kept. Any other state: 409.",
                "parameters": [_job_id_param()],
                "responses": {
                    "200": _json(job, "Queued again."),
                    **_responses("Unauthorized", "NotFound", "Conflict", "Unavailable"),
                },
            }
        },
        "/queues": {
            "get": {
                "operationId": "listQueues",
                "summary": "Queues with their unfinished jobs by state",
                "description": "Every queue with unfinished jobs or that was "
                "paused/resumed. Counts are exact and read only unfinished rows, so they "
                "cost in proportion to the backlog, not to the finished jobs retention "
                "keeps; finished jobs are counted in total by GET /stats.",
                "responses": {
                    "200": _json(_ref("Queues"), "The queues, by name."),
                    **_responses("Unauthorized", "Unavailable"),
                },
            }
        },
        "/queues/{name}/pause": {
            "post": {
                "operationId": "pauseQueue",
                "summary": "Stop workers claiming from a queue",
                "description": "Running jobs finish; submissions are still accepted. A "
                "queue can be paused before it has jobs.",
                "parameters": [_queue_name_param()],
                "responses": {
                    "200": _json(_ref("Queue"), "Paused."),
                    **_responses("Unauthorized", "Unprocessable", "Unavailable"),
                },
            }
        },
        "/queues/{name}/resume": {
            "post": {
                "operationId": "resumeQueue",
                "summary": "Let workers claim from a queue again",
                "parameters": [_queue_name_param()],
                "responses": {
                    "200": _json(_ref("Queue"), "Resumed."),
                    **_responses("Unauthorized", "Unprocessable", "Unavailable"),
                },
            }
        },
        "/workers": {
            "get": {
                "operationId": "listWorkers",
                "summary": "Registered workers, their last heartbeat and jobs held",
                "responses": {
                    "200": _json(_ref("Workers"), "The workers, by id."),
                    **_responses("Unauthorized", "Unavailable"),
                },
            }
        },
        "/stats": {
            "get": {
                "operationId": "getStats",
                "summary": "Job counts by state in total, unfinished ones per queue",
                "description": "Unfinished states are exact (as GET /queues). Finished "
                f"states (succeeded, dead, cancelled) are counted exactly up to "
                f"{FINISHED_COUNT_CAP} each "
                "and estimated beyond (pg_class.reltuples x pg_stats frequency, as fresh "
                "as the last ANALYZE): `estimated` names those states. Never scans the "
                "table, however many finished jobs it holds.",
                "responses": {
                    "200": _json(_ref("Stats"), "The counts."),
                    **_responses("Unauthorized", "Unavailable"),
                },
            }
        },
        "/health": {
            "get": {
                "operationId": "health",
                "summary": "The process is up (no auth, no database)",
                "security": [],
                "responses": {
                    "200": _json(
                        {
                            "type": "object",
                            "properties": {"status": {"const": "ok"}},
                            "required": ["status"],
                        },
                        "Up.",
                    )
                },
            }
        },
        "/ready": {
            "get": {
                "operationId": "ready",
                "summary": "The database answers and its schema is current",
                "responses": {
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
                    ),
                    **_responses("Unauthorized", "Unavailable"),
                },
            }
        },
        "/metrics": {
            "get": {
                "operationId": "metrics",
                "summary": "Prometheus metrics",
                "description": "This process's metrics, plus `deadman_jobs{queue,state}` "
                "gauges counted at scrape time (the cost note of GET /queues applies: "
                "scrape every 15 s or more, not every second) and "
                "`deadman_api_database_up`. A database outage does not fail the scrape.",
                "responses": {
                    "200": {
                        "description": "Prometheus text format.",
                        "content": {"text/plain": {"schema": {"type": "string"}}},
                    },
                    **_responses("Unauthorized"),
                },
            }
        },
        "/openapi.json": {
            "get": {
                "operationId": "openapi",
                "summary": "This document",
                "responses": {
                    "200": _json({"type": "object"}, "OpenAPI 3.1."),
                    **_responses("Unauthorized"),
                },
            }
        },
    }


def _version() -> str:
    try:
        return version("deadman")
    except PackageNotFoundError:  # pragma: no cover - running from a bare checkout
        return "0"


#: OpenAPI links (section 4.8.20): which operation can follow which, with the id it
#: takes from the response. They document the life of a job for client authors, and
#: they are what the stateful schemathesis run walks: create -> get -> cancel ->
#: retry -> get, on real ids, not only on generated ones that name no job.
#: (path, method, statuses) -> {link name: (operationId, runtime expression)}.
_JOB_ID = "$response.body#/id"
_FIRST_JOB_ID = "$response.body#/jobs/0/id"
_FIRST_NODE_JOB_ID = "$response.body#/nodes/0/job_id"
LINKS: dict[tuple[str, str, tuple[str, ...]], dict[str, tuple[str, str]]] = {
    ("/jobs", "post", ("200", "201")): {
        "GetJob": ("getJob", _JOB_ID),
        "GetJobAttempts": ("getJobAttempts", _JOB_ID),
        "CancelJob": ("cancelJob", _JOB_ID),
        "RetryJob": ("retryJob", _JOB_ID),
    },
    ("/jobs/batch", "post", ("200", "201")): {
        "GetFirstJob": ("getJob", _FIRST_JOB_ID),
        "CancelFirstJob": ("cancelJob", _FIRST_JOB_ID),
    },
    ("/jobs/{id}", "get", ("200",)): {
        "CancelJob": ("cancelJob", _JOB_ID),
        "RetryJob": ("retryJob", _JOB_ID),
    },
    ("/jobs/{id}/cancel", "post", ("200", "202")): {
        "GetJob": ("getJob", _JOB_ID),
        "RetryJob": ("retryJob", _JOB_ID),
    },
    ("/jobs/{id}/retry", "post", ("200",)): {
        "GetJob": ("getJob", _JOB_ID),
        "CancelJob": ("cancelJob", _JOB_ID),
    },
    ("/workflows", "post", ("200", "201")): {
        "GetWorkflow": ("getWorkflow", _JOB_ID),
        "CancelWorkflow": ("cancelWorkflow", _JOB_ID),
        "GetFirstNodeJob": ("getJob", _FIRST_NODE_JOB_ID),
        "CancelFirstNodeJob": ("cancelJob", _FIRST_NODE_JOB_ID),
    },
    ("/workflows/{id}/cancel", "post", ("200", "202")): {
        "GetWorkflow": ("getWorkflow", _JOB_ID),
    },
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


def document(settings: Settings) -> dict[str, Any]:
    """The document as this server is configured (auth on or off, the size limit)."""
    secured = settings.api_token is not None
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Deadman",
            "version": _version(),
            "description": "A Postgres-backed job queue. Every error is "
            "application/problem+json (RFC 9457). Submission is durable when "
            "acknowledged; execution is at-least-once. "
            + (
                "Every endpoint but /health needs `Authorization: Bearer <token>`."
                if secured
                else "Authentication is off (DEADMAN_API_TOKEN unset)."
            ),
        },
        "paths": _with_links({**_paths(), **_workflow_paths()}),
        "components": {
            "schemas": {**_schemas(), **_workflow_schemas(), **_spec_schemas()},
            "responses": _shared_responses(settings),
            "securitySchemes": {"bearerAuth": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearerAuth": []}] if secured else [],
    }
