"""Building blocks of the OpenAPI document: references, JSON bodies, shared patterns,
parameters and the error responses every operation may answer."""

from __future__ import annotations

from typing import Any

from deadman import storable
from deadman.bounds import ID_PATTERN, KEY_MAX_LEN, NAME_PATTERN
from deadman.config import Settings
from deadman.model import JobState

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


def _body(schema_name: str) -> dict[str, Any]:
    """A required JSON request body of the schema ``schema_name``."""
    return {"required": True, "content": {"application/json": {"schema": _ref(schema_name)}}}


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


def _queue_name_param(name: str = "name") -> dict[str, Any]:
    """A name in the path (a queue's, a limit's key): the pattern of deadman.bounds."""
    return {
        "name": name,
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


#: the shared error responses of each kind of operation
_READ = ("Unauthorized", "Unavailable")
_FOUND_OR_NOT = ("Unauthorized", "NotFound", "Unavailable")
_ACTION = ("Unauthorized", "NotFound", "Conflict", "Unavailable")
_BY_NAME = ("Unauthorized", "Unprocessable", "Unavailable")
_FOUND_BY_NAME = ("NotFound", *_BY_NAME)


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
        "requestBody": _body(body),
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
