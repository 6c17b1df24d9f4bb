"""Request validation, written by hand against the OpenAPI document in openapi.py.

Why by hand: the rules go beyond what a schema library checks for us (a body nested
too deep must be a 422, never a RecursionError turned 500; strings Postgres cannot
store in jsonb, such as ``\\u0000`` or a lone surrogate, must be refused before they
reach SQL; a 422 names every broken field), and there are few of them. Every check
here has its twin in openapi.py; the schemathesis test keeps the two honest.

Everything that leaves this module is validated: ``NewJob`` and ``ListParams``
values, ids and names. Nothing from a request reaches SQL in any other form, and
always as a parameter.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

from starlette.datastructures import QueryParams
from starlette.requests import Request

from deadman.api.problems import Problem, validation
from deadman.errors import InvalidJob
from deadman.model import QUEUE_RE, TYPE_RE, Backoff, JobState, find_cycle
from deadman.storable import MAX_DEPTH, FieldError, check_storable
from deadman.store import (
    MAX_DELAY_MS,
    MAX_EDGES,
    MAX_NODES,
    MAX_TIMEOUT_MS,
    ListParams,
    NewJob,
    NewWorkflow,
)

#: Deepest JSON nesting accepted in a body (the body object itself is level 1).
MAX_BATCH = 1000
MAX_ATTEMPTS = 100
MAX_BACKOFF_MS = 86_400_000
MAX_KEY_LEN = 255
LIMIT_DEFAULT, LIMIT_MAX = 100, 1000
MAX_BIGINT = 2**63 - 1
# RFC 3339 section 5.6 date-time; "T" and "Z" may be lower case (its note). An offset
# is required: a time without one means nothing to a server in another zone.
RFC3339_RE = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})[Tt](\d{2}):(\d{2}):(\d{2})(?:\.(\d+))?"
    r"(?:[Zz]|([+-])(\d{2}):(\d{2}))\Z",
    re.ASCII,  # \d means 0-9 only, not every script's digits
)
# Inside Python's datetime range with a day to spare on both ends, so that no time
# zone conversion (ours or the database session's) can overflow when it is read back.
RUN_AT_MIN = datetime(1, 1, 2, tzinfo=UTC)
RUN_AT_MAX = datetime(9999, 12, 30, tzinfo=UTC)

JOB_FIELDS = frozenset(
    {
        "type",
        "payload",
        "queue",
        "priority",
        "max_attempts",
        "backoff",
        "run_at",
        "delay_ms",
        "timeout_ms",
    }
)
#: Deadlines: single jobs, batch items and workflow nodes.
DEADLINE_FIELDS = frozenset({"start_by", "deadline", "heartbeat_timeout_ms"})
SINGLE_JOB_FIELDS = JOB_FIELDS | DEADLINE_FIELDS | {"depends_on"}
BATCH_ITEM_FIELDS = SINGLE_JOB_FIELDS | {"idempotency_key"}
NODE_FIELDS = JOB_FIELDS | DEADLINE_FIELDS | {"name"}
WORKFLOW_FIELDS = frozenset({"name", "nodes", "edges"})
EDGE_FIELDS = frozenset({"from", "to"})
MAX_DEPENDS_ON = 100
BACKOFF_FIELDS = frozenset({"strategy", "base_ms", "max_ms", "jitter"})
STATE_NAMES = tuple(s.value for s in JobState)
NAME_RULE = "must be 1-128 characters of A-Z a-z 0-9 _ . : -"
KEY_RULE = "must be 1-255 characters, without control characters"


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
    raw = await request.body()
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


class _Fields:
    """Collects field errors, so one 422 names every broken field at once."""

    def __init__(self) -> None:
        self.errors: list[FieldError] = []

    def add(self, field: str, message: str) -> None:
        self.errors.append({"field": field, "message": message})

    def integer(
        self, obj: Mapping[str, Any], name: str, field: str, lo: int, hi: int
    ) -> int | None:
        """The value if it is an integer in [lo, hi], else record an error. As in JSON
        Schema, a number with a zero fraction (``5.0``) is an integer."""
        value = obj[name]
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
            self.add(field, f"must be an integer from {lo} to {hi}")
            return None
        return value

    def raise_if_any(self) -> None:
        if self.errors:
            raise validation(self.errors)


def parse_new_job(
    body: Any, *, idempotency_key: str | None = None, batch_index: int | None = None
) -> NewJob:
    """The body of ``POST /jobs`` (or one item of a batch) as a validated NewJob."""
    fields = _Fields()
    job = _new_job(
        body,
        fields,
        idempotency_key=idempotency_key,
        batch_index=batch_index,
        allowed=SINGLE_JOB_FIELDS if batch_index is None else None,
    )
    fields.raise_if_any()
    assert job is not None
    return job


def _new_job(
    body: Any,
    fields: _Fields,
    *,
    idempotency_key: str | None,
    batch_index: int | None,
    prefix: str | None = None,
    allowed: frozenset[str] | None = None,
) -> NewJob | None:
    if prefix is None:
        prefix = "" if batch_index is None else f"jobs[{batch_index}]."
    if allowed is None:
        allowed = JOB_FIELDS if batch_index is None else BATCH_ITEM_FIELDS
    start = len(fields.errors)
    if not isinstance(body, dict):
        fields.add(prefix.rstrip(".") or "body", "must be a JSON object")
        return None
    for name in sorted(set(body) - allowed):
        fields.add(prefix + name, "is not a field of a job")

    job_type = body.get("type")
    if "type" not in body:
        fields.add(prefix + "type", "is required")
    elif not isinstance(job_type, str) or not TYPE_RE.fullmatch(job_type):
        fields.add(prefix + "type", NAME_RULE)

    queue = body.get("queue", "default")
    if not isinstance(queue, str) or not QUEUE_RE.fullmatch(queue):
        fields.add(prefix + "queue", NAME_RULE)

    priority = 0
    if "priority" in body:
        priority = fields.integer(body, "priority", prefix + "priority", -100, 100) or 0

    max_attempts = None
    if "max_attempts" in body:
        max_attempts = fields.integer(body, "max_attempts", prefix + "max_attempts", 1, 100)

    backoff = Backoff()
    if "backoff" in body:
        backoff = _backoff(body["backoff"], prefix + "backoff", fields) or backoff

    run_at = None
    if "run_at" in body:
        run_at = _rfc3339(body["run_at"], prefix + "run_at", fields)
    delay_ms = 0
    if "delay_ms" in body:
        delay_ms = fields.integer(body, "delay_ms", prefix + "delay_ms", 0, MAX_DELAY_MS) or 0
        if "run_at" in body:
            fields.add(prefix + "delay_ms", "give run_at or delay_ms, not both")

    timeout_ms = None
    if "timeout_ms" in body:
        timeout_ms = fields.integer(body, "timeout_ms", prefix + "timeout_ms", 1, MAX_TIMEOUT_MS)

    start_by = deadline = None
    if "start_by" in body:
        start_by = _rfc3339(body["start_by"], prefix + "start_by", fields)
    if "deadline" in body:
        deadline = _rfc3339(body["deadline"], prefix + "deadline", fields)
    heartbeat_timeout_ms = None
    if "heartbeat_timeout_ms" in body:
        heartbeat_timeout_ms = fields.integer(
            body, "heartbeat_timeout_ms", prefix + "heartbeat_timeout_ms", 1, MAX_TIMEOUT_MS
        )
    depends_on: tuple[int, ...] = ()
    if "depends_on" in body:
        depends_on = _job_ids(body["depends_on"], prefix + "depends_on", fields)

    key = idempotency_key
    if "idempotency_key" in body:
        key = body["idempotency_key"]
        if not isinstance(key, str) or not valid_key(key):
            fields.add(prefix + "idempotency_key", KEY_RULE)

    if len(fields.errors) > start:
        return None
    try:
        return NewJob(
            type=str(job_type),
            payload=body.get("payload"),
            queue=queue,
            priority=priority,
            run_at=run_at,
            delay_ms=delay_ms,
            max_attempts=max_attempts,
            backoff=backoff,
            timeout_ms=timeout_ms,
            idempotency_key=key,
            depends_on=depends_on,
            start_by=start_by,
            deadline=deadline,
            heartbeat_timeout_ms=heartbeat_timeout_ms,
        )
    except InvalidJob as exc:  # a rule the model holds that we did not (defence in depth)
        fields.add(prefix.rstrip(".") or "body", str(exc))
        return None


def _job_ids(value: Any, field: str, fields: _Fields) -> tuple[int, ...]:
    """``depends_on``: up to MAX_DEPENDS_ON distinct job ids (strings, as the API gives
    them out, or integers)."""
    if not isinstance(value, list) or len(value) > MAX_DEPENDS_ON:
        fields.add(field, f"must be an array of at most {MAX_DEPENDS_ON} job ids")
        return ()
    ids: list[int] = []
    for i, item in enumerate(value):
        raw = item
        if isinstance(item, int) and not isinstance(item, bool):
            raw = str(item) if abs(item) < 10**20 else ""  # what JSON parsed, str() can write
        well_formed = isinstance(raw, str) and _ID.fullmatch(raw) is not None
        job_id = parse_id(raw) if well_formed else None
        if not well_formed:
            fields.add(f"{field}[{i}]", "must be a job id")
        elif job_id is None:  # well-formed, but past bigint: no job can have it
            fields.add(f"{field}[{i}]", f"depends_on names unknown jobs: {raw}")
        elif job_id in ids:
            fields.add(f"{field}[{i}]", "repeats an earlier id")
        else:
            ids.append(job_id)
    return tuple(ids)


def parse_workflow(body: Any, *, idempotency_key: str | None = None) -> NewWorkflow:
    """``POST /workflows``: a name, 1-1000 nodes with unique names, edges between
    known nodes and no cycle. Each problem is a 422 naming its field."""
    fields = _Fields()
    if not isinstance(body, dict):
        fields.add("body", "must be a JSON object with name, nodes and edges")
        fields.raise_if_any()
    for name in sorted(set(body) - WORKFLOW_FIELDS):
        fields.add(name, "is not a field of a workflow")
    wf_name = body.get("name")
    if not isinstance(wf_name, str) or not 1 <= len(wf_name) <= 128 or _CONTROL.search(wf_name):
        fields.add("name", "must be 1-128 characters, without control characters")
    items = body.get("nodes")
    if not isinstance(items, list) or not 1 <= len(items) <= MAX_NODES:
        fields.add("nodes", f"must be an array of 1 to {MAX_NODES} nodes")
        fields.raise_if_any()
    nodes: list[tuple[str, NewJob]] = []
    seen: dict[str, int] = {}
    for i, item in enumerate(items):
        prefix = f"nodes[{i}]."
        node_name = item.get("name") if isinstance(item, dict) else None
        if isinstance(item, dict):
            if not isinstance(node_name, str) or not TYPE_RE.fullmatch(node_name):
                fields.add(prefix + "name", NAME_RULE)
                node_name = None
            elif node_name in seen:
                fields.add(prefix + "name", f"repeats the name of nodes[{seen[node_name]}]")
            else:
                seen[node_name] = i
        job = _new_job(
            {k: v for k, v in item.items() if k != "name"} if isinstance(item, dict) else item,
            fields,
            idempotency_key=None,
            batch_index=None,
            prefix=prefix,
            allowed=NODE_FIELDS,
        )
        if job is not None and isinstance(node_name, str):
            nodes.append((node_name, job))
    edges: list[tuple[str, str]] = []
    raw_edges = body.get("edges", [])
    if not isinstance(raw_edges, list) or len(raw_edges) > MAX_EDGES:
        fields.add("edges", f"must be an array of at most {MAX_EDGES} edges")
        raw_edges = []
    seen_edges: set[tuple[str, str]] = set()
    for i, edge in enumerate(raw_edges):
        if not isinstance(edge, dict):
            fields.add(f"edges[{i}]", "must be an object with from and to")
            continue
        for name in sorted(set(edge) - EDGE_FIELDS):
            fields.add(f"edges[{i}].{name}", "is not a field of an edge")
        ends: list[str] = []
        for end in ("from", "to"):
            value = edge.get(end)
            if not isinstance(value, str) or value not in seen:
                fields.add(f"edges[{i}].{end}", "must name a node")
            else:
                ends.append(value)
        if len(ends) == 2:
            pair = (ends[0], ends[1])
            if pair[0] == pair[1]:
                fields.add(f"edges[{i}]", "a node cannot depend on itself")
            elif pair in seen_edges:
                fields.add(f"edges[{i}]", "repeats an earlier edge")
            else:
                seen_edges.add(pair)
                edges.append(pair)
    fields.raise_if_any()
    cycle = find_cycle([n for n, _ in nodes], edges)
    if cycle:
        fields.add("edges", "form a cycle: " + " -> ".join(cycle))
        fields.raise_if_any()
    return NewWorkflow(
        name=str(wf_name),
        nodes=tuple(nodes),
        edges=tuple(edges),
        idempotency_key=idempotency_key,
    )


def _backoff(value: Any, field: str, fields: _Fields) -> Backoff | None:
    if not isinstance(value, dict):
        fields.add(field, "must be an object")
        return None
    start = len(fields.errors)
    for name in sorted(set(value) - BACKOFF_FIELDS):
        fields.add(f"{field}.{name}", "is not a field of backoff")
    strategy = value.get("strategy", "exponential")
    if strategy not in ("exponential", "fixed"):
        fields.add(f"{field}.strategy", "must be 'exponential' or 'fixed'")
    jitter = value.get("jitter", "full")
    if jitter not in ("full", "none"):
        fields.add(f"{field}.jitter", "must be 'full' or 'none'")
    base_ms = 1000
    if "base_ms" in value:
        base_ms = fields.integer(value, "base_ms", f"{field}.base_ms", 0, MAX_BACKOFF_MS) or 0
    # Without max_ms, the default cap (300 s) rises to base_ms rather than undercut it.
    max_ms = max(300_000, base_ms)
    if "max_ms" in value:
        got = fields.integer(value, "max_ms", f"{field}.max_ms", 0, MAX_BACKOFF_MS)
        if got is not None and got < base_ms:
            fields.add(f"{field}.max_ms", "must be at least base_ms")
        max_ms = got or 0
    if len(fields.errors) > start:
        return None
    return Backoff(strategy=strategy, base_ms=base_ms, max_ms=max_ms, jitter=jitter)


RANGE_RULE = "must be between 0001-01-02 and 9999-12-30"


def _rfc3339(value: Any, field: str, fields: _Fields) -> datetime | None:
    rule = "must be an RFC 3339 date-time with an offset, e.g. 2025-01-31T12:00:00Z"
    m = RFC3339_RE.fullmatch(value) if isinstance(value, str) else None
    if m is None:
        fields.add(field, rule)
        return None
    year, month, day, hour, minute, second = (int(m.group(i)) for i in range(1, 7))
    micro = int((m.group(7) or "0")[:6].ljust(6, "0"))
    leap = second == 60  # a leap second: the instant after :59
    try:
        offset = timedelta(0)
        if m.group(8):
            hours, minutes = int(m.group(9)), int(m.group(10))
            if hours > 23 or minutes > 59:
                raise ValueError("offset out of range")
            offset = timedelta(hours=hours, minutes=minutes) * (-1 if m.group(8) == "-" else 1)
        tz = timezone(offset)
        parsed = datetime(year, month, day, hour, minute, 59 if leap else second, micro, tz)
        if leap:
            parsed += timedelta(seconds=1)
        utc = parsed.astimezone(UTC)
    except (ValueError, OverflowError) as exc:
        # Year 0000 is valid RFC 3339 syntax, and an offset can push 9999-12-31 past
        # the calendar: both are out of range, not malformed.
        out_of_range = year == 0 or isinstance(exc, OverflowError)
        fields.add(field, RANGE_RULE if out_of_range else rule)
        return None
    if not RUN_AT_MIN <= utc <= RUN_AT_MAX:
        fields.add(field, RANGE_RULE)
        return None
    # In UTC: RFC 3339 allows offsets up to 23:59, Postgres only up to 15:59; and the
    # same instant written in two zones is the same request (request_hash).
    return utc


def parse_batch(body: Any) -> list[NewJob]:
    """``{"jobs": [...]}``: 1 to 1000 jobs, each may carry ``idempotency_key`` (unique)."""
    fields = _Fields()
    if not isinstance(body, dict):
        fields.add("body", "must be a JSON object with a jobs array")
        fields.raise_if_any()
    for name in sorted(set(body) - {"jobs"}):
        fields.add(name, "is not a field of a batch")
    items = body.get("jobs")
    if not isinstance(items, list) or not 1 <= len(items) <= MAX_BATCH:
        fields.add("jobs", f"must be an array of 1 to {MAX_BATCH} jobs")
        fields.raise_if_any()
    jobs: list[NewJob] = []
    first_use: dict[str, int] = {}
    for i, item in enumerate(items):
        job = _new_job(item, fields, idempotency_key=None, batch_index=i)
        if job is None:
            continue
        jobs.append(job)
        if job.idempotency_key is not None:
            if job.idempotency_key in first_use:
                fields.add(
                    f"jobs[{i}].idempotency_key",
                    f"repeats the key of jobs[{first_use[job.idempotency_key]}]",
                )
            first_use.setdefault(job.idempotency_key, i)
    fields.raise_if_any()
    return jobs


# ------------------------------------------------------------------------ keys, ids


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


#: The header form: what HTTP carries without surprises (no control characters, no
#: leading or trailing space, which servers strip anyway).
HEADER_KEY_RE = re.compile(r"[\x21-\x7e](?:[\x20-\x7e]{0,253}[\x21-\x7e])?")
HEADER_KEY_RULE = "must be 1-255 visible ASCII characters (spaces only inside)"
_SF_STRING = re.compile(r'(?:[\x20\x21\x23-\x5b\x5d-\x7e]|\\["\\])+')


def valid_key(key: str) -> bool:
    return 1 <= len(key) <= MAX_KEY_LEN and _CONTROL.search(key) is None


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
_ID = re.compile(r"[1-9][0-9]{0,18}")


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
    if not QUEUE_RE.fullmatch(raw):
        raise validation([{"field": "name", "message": NAME_RULE}])
    return raw


def parse_list_query(query: QueryParams) -> ListParams:
    """``GET /jobs`` filters: an unknown state, a bad limit or cursor is a 422."""
    fields = _Fields()
    values: dict[str, str] = {}
    for name in ("state", "type", "queue", "limit", "cursor"):
        given = query.getlist(name)
        if len(given) > 1:
            fields.add(name, "give it at most once")
        elif given:
            values[name] = given[0]
    state = values.get("state")
    if state is not None and state not in STATE_NAMES:
        fields.add("state", "must be one of " + ", ".join(STATE_NAMES))
    for name in ("type", "queue"):
        if name in values and not TYPE_RE.fullmatch(values[name]):
            fields.add(name, NAME_RULE)
    limit = LIMIT_DEFAULT
    if "limit" in values:
        raw = values["limit"]
        got = ascii_int(raw, 1, LIMIT_MAX)
        if got is None:
            fields.add("limit", f"must be an integer from 1 to {LIMIT_MAX}")
        else:
            limit = got
    before = None
    if "cursor" in values:
        before = parse_id(values["cursor"])
        if before is None:
            fields.add("cursor", "is not a cursor this API issued (use next_cursor as is)")
    fields.raise_if_any()
    return ListParams(
        limit=limit,
        state=JobState(state) if state is not None else None,
        type=values.get("type"),
        queue=values.get("queue"),
        before_id=before,
    )
