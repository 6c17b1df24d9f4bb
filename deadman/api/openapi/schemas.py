"""The components/schemas of the OpenAPI document: what the API answers (written
here) and what clients submit (generated from deadman.spec, the models that validate it)."""

from __future__ import annotations

from typing import Any

from pydantic.json_schema import models_json_schema

from deadman.api.openapi.common import (
    _COUNT,
    _DATETIME,
    _DATETIME_OR_NULL,
    LIVE_STATES,
    STATES,
    TERMINAL_STATES,
    _ref,
)
from deadman.api.problems import KINDS, TYPE_PREFIX
from deadman.bounds import ID_PATTERN
from deadman.model import AttemptOutcome
from deadman.spec import BatchSpec, JobSpec, LimitSpec, ScheduleSpec, WorkflowSpec
from deadman.tracing import TRACESTATE_MAX

#: what deadman.tracing.carrier stores (a later version is stored as version 00)
TRACEPARENT_PATTERN = "^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$"


def _list_of(key: str, item: str) -> dict[str, Any]:
    """``{key: [item, ...]}``, nothing else."""
    return {
        "type": "object",
        "properties": {key: {"type": "array", "items": _ref(item)}},
        "required": [key],
        "additionalProperties": False,
    }


def _spec_schemas() -> dict[str, Any]:
    """What clients submit, generated from deadman.spec: the same models validate the
    requests, so the document and the server cannot disagree on a bound."""
    _, top = models_json_schema(
        [(m, "validation") for m in (JobSpec, BatchSpec, WorkflowSpec, LimitSpec, ScheduleSpec)],
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
    if out.pop("x-accepts-null", False):  # spec.fields.ACCEPTS_NULL: null is a value
        pass
    elif isinstance(options, list) and len(options) == 2 and {"type": "null"} in options:
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
                "limit_key": {"type": ["string", "null"]},
                "trace_context": {"anyOf": [{"type": "null"}, _ref("TraceContext")]},
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
                "limit_key",
                "trace_context",
            ],
            "additionalProperties": False,
        },
        "TraceContext": {
            "type": "object",
            "description": "The W3C trace context the job was enqueued in: the "
            "`traceparent` (and `tracestate`) headers of `POST /jobs` or `/jobs/batch`, "
            "or the current span of a Python client. A malformed `traceparent` is "
            "ignored, not refused; the worker's span for each attempt links to it.",
            "properties": {
                "traceparent": {"type": "string", "pattern": TRACEPARENT_PATTERN},
                "tracestate": {"type": "string", "maxLength": TRACESTATE_MAX},
            },
            "required": ["traceparent"],
            "additionalProperties": False,
        },
        "JobPage": {
            "type": "object",
            "properties": {
                "jobs": {"type": "array", "items": _ref("Job")},
                "next_cursor": {
                    "type": ["string", "null"],
                    "description": (
                        "Pass as `cursor` for the next (older) page; null on the last. A "
                        "page filtered by queue or type may be short and still have one."
                    ),
                },
            },
            "required": ["jobs", "next_cursor"],
            "additionalProperties": False,
        },
        "Jobs": _list_of("jobs", "Job"),
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
        "Attempts": _list_of("attempts", "Attempt"),
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
        "Queues": _list_of("queues", "Queue"),
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
        "Workers": _list_of("workers", "Worker"),
        "Limit": {
            "type": "object",
            "description": "A key's limit and its live state.",
            "properties": {
                "key": {"type": "string"},
                "concurrency": {"type": ["integer", "null"], "minimum": 1},
                "rate": {
                    "anyOf": [
                        {
                            "type": "object",
                            "properties": {
                                "count": {"type": "integer", "minimum": 1},
                                "per_ms": {"type": "integer", "minimum": 1},
                            },
                            "required": ["count", "per_ms"],
                            "additionalProperties": False,
                        },
                        {"type": "null"},
                    ]
                },
                "running": {
                    "type": "integer",
                    "minimum": 0,
                    "description": "Jobs with this key running now: the slots they hold "
                    "(a slot is freed when its job finishes or its lapsed lease is rescued).",
                },
                "available": {
                    "type": ["integer", "null"],
                    "minimum": 0,
                    "description": "Starts the rate allows now; null without a rate.",
                },
            },
            "required": ["key", "concurrency", "rate", "running", "available"],
            "additionalProperties": False,
        },
        "Limits": _list_of("limits", "Limit"),
        "Schedule": {
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "cron": {"type": ["string", "null"]},
                "every_ms": {"type": ["integer", "null"]},
                "timezone": {"type": "string"},
                "job": {"type": "object", "description": "The POST /jobs body of each tick."},
                "catch_up": {"enum": ["none", "latest"]},
                "paused": {"type": "boolean"},
                "next_fire_at": _DATETIME,
                "last_fire_at": _DATETIME_OR_NULL,
                "last_job_id": {"type": ["string", "null"], "pattern": ID_PATTERN},
            },
            "required": [
                "name",
                "cron",
                "every_ms",
                "timezone",
                "job",
                "catch_up",
                "paused",
                "next_fire_at",
                "last_fire_at",
                "last_job_id",
            ],
            "additionalProperties": False,
        },
        "Schedules": _list_of("schedules", "Schedule"),
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
