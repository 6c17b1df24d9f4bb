"""Reading requests: the body's JSON, then the spec (deadman.spec) for bodies, and
the ids, names, keys and query parameters of the path, the headers and the query.

The JSON pre-pass holds the rules a schema library cannot express: a body nested too
deep is a 422, never a RecursionError turned 500; strings Postgres cannot store in
jsonb, such as ``\\u0000`` or a lone surrogate, are refused before they reach SQL; a
key twice in one object is refused. The bodies' rules are the spec's, which also
makes the OpenAPI components (openapi.py).

Everything that leaves this module is validated: ``NewJob`` and ``ListParams``
values, ids and names. Nothing from a request reaches SQL in any other form, and
always as a parameter.
"""

from __future__ import annotations

import json
import re
from typing import Any, TypeVar

from starlette.datastructures import QueryParams
from starlette.requests import Request

from deadman.api.problems import Problem, validation
from deadman.bounds import ID_PATTERN, MAX_BIGINT, NAME_RE, NAME_RULE
from deadman.model import JobState
from deadman.spec import BatchSpec, JobSpec, Spec, SpecError, WorkflowSpec, validate
from deadman.storable import MAX_DEPTH, FieldError, check_storable
from deadman.store import ListParams, NewJob, NewWorkflow

S = TypeVar("S", bound=Spec)
LIMIT_DEFAULT, LIMIT_MAX = 100, 1000
STATE_NAMES = tuple(s.value for s in JobState)


class _NotFinite(ValueError):
    """NaN and Infinity are not JSON (RFC 8259), though Python's json accepts them."""


def _reject_constant(name: str) -> Any:
    raise _NotFinite(f"{name} is not valid JSON")


class _DuplicateKey(ValueError):
    """A key twice in one object. RFC 8259 leaves the meaning to the parser: Python
    keeps the last, others the first, so a proxy or a log could read another job
    than the one we store (and fingerprint). Refused rather than guessed."""


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) == len(pairs):
        return obj
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            raise _DuplicateKey(f"an object has the key {json.dumps(key)} more than once")
        seen.add(key)
    raise AssertionError("unreachable: dict() dropped no key")  # pragma: no cover


# ------------------------------------------------------------------------ bodies


def check_json_content_type(request: Request) -> None:
    """415 unless the body is declared as JSON (UTF-8, the only charset JSON has)."""
    raw = request.headers.get("content-type")
    media, _, params = (raw or "").partition(";")
    charset = ""
    for param in params.split(";"):
        name, _, value = param.strip().partition("=")
        if name.strip().lower() == "charset":
            charset = value.strip().strip('"').lower()
    if media.strip().lower() != "application/json" or charset not in ("", "utf-8", "utf8"):
        raise Problem(
            "unsupported-media-type",
            f"send the body as application/json, not {raw or 'without a Content-Type'}",
            headers={"Accept-Post": "application/json"},
        )


async def read_json(request: Request) -> Any:
    """Parse the body as JSON; 415, 400 (not JSON) or 422 (too deep, unstorable).

    The body-limit middleware has already refused anything over the size limit.
    """
    check_json_content_type(request)
    return loads(await request.body())


def loads(raw: bytes) -> Any:
    """``raw`` as JSON that Postgres can store: 400 (not JSON) or 422 (too deep, a key
    twice, unstorable), as a Problem. The HTTP API's bodies and the CLI's arguments."""
    if not raw.strip():
        raise Problem("malformed-json", "the request body is empty; send a JSON object")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise Problem("malformed-json", f"the body is not UTF-8: {exc.reason}") from None
    try:
        value = json.loads(text, parse_constant=_reject_constant, object_pairs_hook=_object)
    except RecursionError:
        # The C parser gives up on deep nesting before we can measure it: the same
        # answer as for any body nested too deep.
        raise validation(
            [{"field": "body", "message": f"JSON nested deeper than {MAX_DEPTH} levels"}]
        ) from None
    except json.JSONDecodeError as exc:
        raise Problem(
            "malformed-json", f"the body is not valid JSON: {exc.msg} at position {exc.pos}"
        ) from None
    except _NotFinite as exc:
        raise Problem("malformed-json", f"the body is not valid JSON: {exc}") from None
    except _DuplicateKey as exc:
        raise validation([{"field": "body", "message": str(exc)}]) from None
    except ValueError as exc:  # e.g. an integer literal of more than 4300 digits
        raise validation([{"field": "body", "message": str(exc)}]) from None
    problems = check_storable(value)
    if problems:
        raise validation(problems)
    return value


# ------------------------------------------------------------------------ jobs


def parse_new_job(body: Any, *, idempotency_key: str | None = None) -> NewJob:
    """The body of ``POST /jobs`` as a validated NewJob."""
    return parse_spec(JobSpec, body).to_new_job(idempotency_key)


def parse_batch(body: Any) -> list[NewJob]:
    """``{"jobs": [...]}``: 1 to 1000 jobs, each may carry ``idempotency_key`` (unique)."""
    return parse_spec(BatchSpec, body).to_new_jobs()


def parse_workflow(body: Any, *, idempotency_key: str | None = None) -> NewWorkflow:
    """``POST /workflows``: a name, 1-1000 nodes with unique names, edges between
    known nodes and no cycle."""
    return parse_spec(WorkflowSpec, body).to_new_workflow(idempotency_key)


def parse_spec(model: type[S], body: Any) -> S:
    """``body`` as ``model``, or a 422 naming every broken field."""
    try:
        return validate(model, body)
    except SpecError as exc:
        raise validation(exc.errors) from None


# ------------------------------------------------------------------------ keys, ids


#: The header form: what HTTP carries without surprises (no control characters, no
#: leading or trailing space, which servers strip anyway).
HEADER_KEY_RE = re.compile(r"[\x21-\x7e](?:[\x20-\x7e]{0,253}[\x21-\x7e])?")
HEADER_KEY_RULE = "must be 1-255 visible ASCII characters (spaces only inside)"
_SF_STRING = re.compile(r'(?:[\x20\x21\x23-\x5b\x5d-\x7e]|\\["\\])+')


def parse_idempotency_key(raw: str | None) -> str | None:
    """The ``Idempotency-Key`` header: 1-255 visible ASCII characters (spaces inside).

    The IETF draft makes it a structured-field string (``"abc"``, quotes and all);
    many clients send the bare value. Both are accepted: a well-formed, non-empty
    quoted string is unquoted, anything else is taken as it is.
    """
    if raw is None:
        return None
    key = raw
    if len(raw) > 2 and raw[0] == raw[-1] == '"' and _SF_STRING.fullmatch(raw[1:-1]):
        key = re.sub(r'\\(["\\])', r"\1", raw[1:-1])
    if not HEADER_KEY_RE.fullmatch(key):
        raise validation([{"field": "Idempotency-Key", "message": HEADER_KEY_RULE}])
    return key


# [0-9], never \d or str.isdigit(): those take '²' and '٣', which int() refuses or
# reads as a digit of another script. Nineteen digits at most: bigint has nineteen,
# and int() of 5,000 digits raises (Python caps conversions at 4,300 digits).
_DIGITS = re.compile(r"[0-9]{1,19}")
_ID = re.compile(ID_PATTERN[1:-1])


def ascii_int(raw: str, lo: int = 0, hi: int = MAX_BIGINT) -> int | None:
    """``raw`` as an integer if it is nothing but ASCII digits (no sign, no space, no
    other script's digits) and within ``lo..hi`` (at most bigint); None otherwise.
    Never raises, whatever ``raw`` holds: the one way this API reads a number from a
    path, a query string or a header."""
    if not _DIGITS.fullmatch(raw):
        return None
    value = int(raw)
    return value if lo <= value <= min(hi, MAX_BIGINT) else None


def parse_id(raw: str) -> int | None:
    """An id as this API writes them (jobs, workflows, cursors): 1..bigint in ASCII
    digits without a leading zero, so that each id has one spelling; None otherwise."""
    return ascii_int(raw, 1) if _ID.fullmatch(raw) else None


def parse_job_id(raw: str) -> int:
    """A job id from the path. Anything that cannot be one is simply not found."""
    job_id = parse_id(raw)
    if job_id is None:
        raise Problem("not-found", "no such job")
    return job_id


def parse_workflow_id(raw: str) -> int:
    """A workflow id from the path; anything that cannot be one is not found."""
    workflow_id = parse_id(raw)
    if workflow_id is None:
        raise Problem("not-found", "no such workflow")
    return workflow_id


def parse_queue_name(raw: str) -> str:
    return parse_name(raw, "name")


def parse_name(raw: str, field: str) -> str:
    """A name from the path (queue, limit key): 422 naming ``field`` unless it is one."""
    if not NAME_RE.fullmatch(raw):
        raise validation([{"field": field, "message": NAME_RULE}])
    return raw


def parse_list_query(query: QueryParams) -> ListParams:
    """``GET /jobs`` filters: an unknown state, a bad limit or cursor is a 422."""
    errors: list[FieldError] = []
    values: dict[str, str] = {}
    for name in ("state", "type", "queue", "limit", "cursor"):
        given = query.getlist(name)
        if len(given) > 1:
            errors.append(_error(name, "give it at most once"))
        elif given:
            values[name] = given[0]
    state = values.get("state")
    if state is not None and state not in STATE_NAMES:
        errors.append(_error("state", "must be one of " + ", ".join(STATE_NAMES)))
    for name in ("type", "queue"):
        if name in values and not NAME_RE.fullmatch(values[name]):
            errors.append(_error(name, NAME_RULE))
    limit = LIMIT_DEFAULT
    if "limit" in values:
        raw = values["limit"]
        got = ascii_int(raw, 1, LIMIT_MAX)
        if got is None:
            errors.append(_error("limit", f"must be an integer from 1 to {LIMIT_MAX}"))
        else:
            limit = got
    before = None
    if "cursor" in values:
        before = parse_id(values["cursor"])
        if before is None:
            errors.append(
                _error("cursor", "is not a cursor this API issued (use next_cursor as is)")
            )
    if errors:
        raise validation(errors)
    return ListParams(
        limit=limit,
        state=JobState(state) if state is not None else None,
        type=values.get("type"),
        queue=values.get("queue"),
        before_id=before,
    )


def _error(field: str, message: str) -> FieldError:
    return {"field": field, "message": message}
