"""The field types the spec models are built from: each carries its bounds (which the
OpenAPI document shows) and the one sentence a refusal says (:class:`Rule`)."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta, timezone
from typing import Annotated, Any, TypeVar

from pydantic import BeforeValidator, Field, WithJsonSchema
from pydantic_core import InitErrorDetails, PydanticCustomError, ValidationError

from deadman import bounds as b

#: the error type of every refusal written here; its message is shown as it is
OWN_ERROR = "deadman"


class Rule:
    """The sentence a refusal of this field says, e.g. "must be an integer from 1 to
    100". Pydantic ignores this metadata; :mod:`deadman.spec.errors` reads it."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text

    @classmethod
    def integer(cls, lo: int, hi: int) -> Rule:
        return cls(f"must be an integer from {lo} to {hi}")

    @classmethod
    def array(cls, lo: int, hi: int, what: str) -> Rule:
        if lo == 0:
            return cls(f"must be an array of at most {hi} {what}")
        return cls(f"must be an array of {lo} to {hi} {what}")


#: an explicit null where the field has a default: refused in the field's own words
NULL_ERROR = "deadman_null"


def refuse(message: str) -> PydanticCustomError:
    return PydanticCustomError(OWN_ERROR, message)


def _not_null(value: Any) -> Any:
    if value is None:
        raise PydanticCustomError(NULL_ERROR, "must not be null; leave the field out")
    return value


T = TypeVar("T")
#: the JSON-schema mark of an optional field for which null IS a value (``X | None``
#: without Maybe): the OpenAPI document then keeps its null (openapi.schemas._tidy)
ACCEPTS_NULL = {"x-accepts-null": True}

#: an optional field: leave it out for the default; null is not a value (the server
#: refuses it, as it always has; the OpenAPI document leaves null out: openapi._tidy)
Maybe = Annotated[T | None, BeforeValidator(_not_null)]


def _whole(value: Any) -> Any:
    """As in JSON Schema, a number with a zero fraction (``5.0``) is an integer; any
    other non-integer (``true`` included) stays itself, for the strict check to refuse."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


Whole = BeforeValidator(_whole)

Name = Annotated[
    str, Field(min_length=1, max_length=128, pattern=b.NAME_PATTERN), Rule(b.NAME_RULE)
]
Key = Annotated[
    str,
    Field(min_length=1, max_length=b.KEY_MAX_LEN, pattern=b.KEY_PATTERN),
    Rule(b.KEY_RULE),
]
WorkflowName = Annotated[
    str,
    Field(min_length=1, max_length=128, pattern=b.WORKFLOW_NAME_PATTERN),
    Rule(b.WORKFLOW_NAME_RULE),
]
Priority = Annotated[
    int,
    Field(ge=b.PRIORITY_MIN, le=b.PRIORITY_MAX, strict=True),
    Whole,
    Rule.integer(b.PRIORITY_MIN, b.PRIORITY_MAX),
]
MaxAttempts = Annotated[
    int,
    Field(ge=b.MAX_ATTEMPTS_MIN, le=b.MAX_ATTEMPTS_MAX, strict=True),
    Whole,
    Rule.integer(b.MAX_ATTEMPTS_MIN, b.MAX_ATTEMPTS_MAX),
]
DelayMs = Annotated[
    int, Field(ge=0, le=b.MAX_DELAY_MS, strict=True), Whole, Rule.integer(0, b.MAX_DELAY_MS)
]
TimeoutMs = Annotated[
    int, Field(ge=1, le=b.MAX_TIMEOUT_MS, strict=True), Whole, Rule.integer(1, b.MAX_TIMEOUT_MS)
]
BackoffMs = Annotated[
    int, Field(ge=0, le=b.MAX_BACKOFF_MS, strict=True), Whole, Rule.integer(0, b.MAX_BACKOFF_MS)
]

# ------------------------------------------------------------------------ times

# RFC 3339 section 5.6 date-time; "T" and "Z" may be lower case (its note). An offset
# is required: a time without one means nothing to a server in another zone.
RFC3339_RE = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})[Tt](\d{2}):(\d{2}):(\d{2})(?:\.(\d+))?"
    r"(?:[Zz]|([+-])(\d{2}):(\d{2}))\Z",
    re.ASCII,  # \d means 0-9 only, not every script's digits
)
# Inside Python's datetime range with a day to spare on both ends, so that no time
# zone conversion (ours or the database session's) can overflow when it is read back.
TIME_MIN = datetime(1, 1, 2, tzinfo=UTC)
TIME_MAX = datetime(9999, 12, 30, tzinfo=UTC)
TIME_RULE = "must be an RFC 3339 date-time with an offset, e.g. 2025-01-31T12:00:00Z"
RANGE_RULE = "must be between 0001-01-02 and 9999-12-30"


def parse_rfc3339(value: str) -> datetime:
    """``value`` in UTC; raises ValueError(TIME_RULE or RANGE_RULE)."""
    m = RFC3339_RE.fullmatch(value)
    if m is None:
        raise ValueError(TIME_RULE)
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
        parsed = datetime(
            year, month, day, hour, minute, 59 if leap else second, micro, timezone(offset)
        )
        if leap:
            parsed += timedelta(seconds=1)
        utc = parsed.astimezone(UTC)
    except (ValueError, OverflowError) as exc:
        # Year 0000 is valid RFC 3339 syntax, and an offset can push 9999-12-31 past
        # the calendar: both are out of range, not malformed.
        out_of_range = year == 0 or isinstance(exc, OverflowError)
        raise ValueError(RANGE_RULE if out_of_range else TIME_RULE) from None
    return utc


def _timestamp(value: Any) -> datetime:
    """An RFC 3339 string (HTTP, CLI) or an aware datetime (Python), in UTC: RFC 3339
    allows offsets up to 23:59, Postgres only up to 15:59, and the same instant written
    in two zones is the same request (request_hash)."""
    if isinstance(value, str):
        try:
            utc = parse_rfc3339(value)
        except ValueError as exc:
            raise refuse(str(exc)) from None
    elif isinstance(value, datetime):
        if value.tzinfo is None or value.utcoffset() is None:
            raise refuse("must carry a time zone")
        try:
            utc = value.astimezone(UTC)
        except OverflowError:
            raise refuse(RANGE_RULE) from None
    else:
        raise refuse(TIME_RULE)
    if not TIME_MIN <= utc <= TIME_MAX:
        raise refuse(RANGE_RULE)
    return utc


Timestamp = Annotated[datetime, BeforeValidator(_timestamp)]

# ------------------------------------------------------------------------ ids

# [0-9], never \d or str.isdigit(): those take '²' and '٣'. 1..bigint exactly (the
# pattern is spelled out digit by digit), so int() never sees 5,000 digits.
_ID = re.compile(b.ID_PATTERN[1:-1])


def _job_id(value: Any) -> int:
    """A job id as the API gives them out (a string), or an integer from Python."""
    raw = value
    if isinstance(value, int) and not isinstance(value, bool):
        raw = str(value) if abs(value) < 10**20 else ""  # what JSON parsed, str() can write
    if not isinstance(raw, str) or _ID.fullmatch(raw) is None:
        raise refuse("must be a job id")
    return int(raw)


JobId = Annotated[
    int,
    BeforeValidator(_job_id),
    WithJsonSchema({"type": "string", "pattern": b.ID_PATTERN}),
]


def _job_ids(value: Any) -> Any:
    """``depends_on``: each id checked, and each repeat named by its index, in one go."""
    if not isinstance(value, list) or len(value) > b.MAX_DEPENDS_ON:
        return value  # the list's own rule refuses it
    errors: list[InitErrorDetails] = []
    seen: set[int] = set()
    ids: list[int] = []
    for i, item in enumerate(value):
        try:
            job_id = _job_id(item)
        except PydanticCustomError as exc:
            errors.append({"type": exc, "loc": (i,), "input": item})
            continue
        if job_id in seen:
            errors.append({"type": refuse("repeats an earlier id"), "loc": (i,), "input": item})
        seen.add(job_id)
        ids.append(job_id)
    if errors:
        raise ValidationError.from_exception_data("depends_on", errors)
    return ids


JobIds = Annotated[
    list[JobId],
    BeforeValidator(_job_ids),
    Field(max_length=b.MAX_DEPENDS_ON, json_schema_extra={"uniqueItems": True}),
    Rule.array(0, b.MAX_DEPENDS_ON, "job ids"),
]
