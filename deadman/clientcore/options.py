"""The keyword options of the client calls, and how they become what ``deadman.spec``
checks: durations given as timedeltas or seconds, sent as milliseconds."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any, TypedDict

from deadman import tracing
from deadman.bounds import KEY_MAX_LEN
from deadman.model import Backoff, Job
from deadman.spec import BatchJobSpec, KeyedName, SpecError, validate
from deadman.store import NewJob


class JobOptions(TypedDict, total=False):
    """What ``job`` and ``enqueue`` take besides type and payload: the fields of
    :class:`deadman.JobSpec`, with durations as timedeltas or seconds."""

    queue: str
    priority: int
    run_at: datetime | None
    delay: timedelta | float | None
    max_attempts: int | None
    backoff: Backoff | None
    timeout: timedelta | float | None
    idempotency_key: str | None
    depends_on: Iterable[int | Job]
    start_by: datetime | None
    deadline: datetime | None
    heartbeat_timeout: timedelta | float | None
    limit_key: str | None


#: the options given in seconds, and the spec's field (in milliseconds) for each
_SECONDS = {
    "delay": "delay_ms",
    "timeout": "timeout_ms",
    "heartbeat_timeout": "heartbeat_timeout_ms",
}


def to_ms(value: timedelta | float | int | None) -> int | None:
    if value is None:
        return None
    if isinstance(value, timedelta):
        return round(value.total_seconds() * 1000)
    return round(float(value) * 1000)


#: options whose checked form depends on their value alone, and the exact types a
#: value of theirs may have to be remembered (see ``new_job``)
_REMEMBERED_OPTIONS = frozenset(
    (
        "queue",
        "priority",
        "max_attempts",
        "delay",
        "timeout",
        "heartbeat_timeout",
        "backoff",
        "limit_key",
    )
)
_REMEMBERED_TYPES = frozenset((str, int, float, timedelta, Backoff, type(None)))
#: checked jobs without a payload, by type and options (``new_job``); bounded
_CHECKED: dict[tuple[Any, ...], NewJob] = {}
_CHECKED_MAX = 512


def new_job(type: str, payload: Any, options: JobOptions) -> NewJob:
    """The job the options describe, checked as ``POST /jobs`` checks its body: a
    broken field raises :class:`~deadman.spec.SpecError` naming it.

    Bulk enqueue builds thousands of jobs that differ only in their payload, which the
    spec takes as it is (any JSON, encoded when the job is sent). So a job whose type
    and options were accepted before is not checked again: the checked job is
    remembered without its payload, keyed by the type and every option's name, exact
    type and value (``True`` is not ``1``, ``1.0`` is not ``1``: the spec refuses what
    it does not take as given). Only options whose checked form depends on their value
    alone are remembered: not timestamps (a time zone is an object with behaviour),
    dependencies. An idempotency key, different for every job, is not part of what is
    remembered: a plain one (printable ASCII, 1-255 characters: one the spec takes as
    given) is set on the remembered job; any other goes through the whole check.
    Refusals are never remembered. DECISIONS 64, 93."""
    key = _remembered_key(type, options)
    if key is not None:
        checked = _CHECKED.get(key)
        if checked is not None:
            return traced(_with_payload(checked, payload, options.get("idempotency_key")))
    body: dict[str, Any] = {"type": type, "payload": payload}
    for name, value in options.items():
        if value is None:
            continue
        if name in _SECONDS:
            body[_SECONDS[name]] = to_ms(value)  # type: ignore[arg-type]
        elif name == "backoff":
            body[name] = value.to_json() if isinstance(value, Backoff) else value
        elif name == "depends_on":
            body[name] = [d.id if isinstance(d, Job) else d for d in value]  # type: ignore[attr-defined]
        else:
            body[name] = value
    job = validate(BatchJobSpec, body).to_new_job()
    if key is not None:
        if len(_CHECKED) >= _CHECKED_MAX:
            _CHECKED.clear()
        _CHECKED[key] = replace(job, payload=None, idempotency_key=None)
    return traced(job)


def _with_payload(checked: NewJob, payload: Any, idempotency_key: str | None = None) -> NewJob:
    """A copy of the remembered ``checked`` job with ``payload`` and ``idempotency_key``:
    its fields copied as a dict, set on a bare instance (0.3 µs; ``dataclasses.replace``
    runs ``__init__``, and ``__dict__.update`` on the new instance takes 0.5)."""
    fields = checked.__dict__.copy()
    fields["payload"] = payload
    fields["idempotency_key"] = idempotency_key
    job: NewJob = object.__new__(NewJob)
    object.__setattr__(job, "__dict__", fields)
    return job


def _remembered_key(type_: Any, options: JobOptions) -> tuple[Any, ...] | None:
    """The key new_job remembers a checked job by; None: not to be remembered. An
    idempotency key is left out of it when it is plain (see new_job)."""
    if type(type_) is not str:
        return None
    if not options:
        return (type_,)
    key: list[Any] = [type_]
    for name, value in options.items():
        kind = type(value)
        if name == "idempotency_key" and (value is None or _plain_key(value)):
            continue
        if name not in _REMEMBERED_OPTIONS or kind not in _REMEMBERED_TYPES:
            return None
        key += (name, kind, value)
    return tuple(key)


def _plain_key(value: Any) -> bool:
    """An idempotency key the spec takes as given (``Key``: 1-255 characters, none a
    control character), of the kind that needs no other look: a str of printable
    ASCII. Any other value, good or bad, is left to the spec."""
    return (
        type(value) is str
        and 0 < len(value) <= KEY_MAX_LEN
        and value.isascii()
        and value.isprintable()
    )


def traced(job: NewJob) -> NewJob:
    """``job`` with the current span's trace context (deadman.tracing), when there is
    one: a job carries the context it was built in (``Client.job`` for enqueue_many and
    workflow nodes, or ``enqueue``), so the worker's run span links to that trace."""
    found = tracing.current()
    return job if found is None else replace(job, trace_context=found)


def checked_name(value: str, field: str) -> str:
    """A limit's key or a schedule's name, refused in the words the API uses for the
    name in its path (``PUT /limits/{key}``, ``/schedules/{name}``)."""
    try:
        return validate(KeyedName, {"key": value}).key
    except SpecError as exc:
        raise SpecError([{**e, "field": field} for e in exc.errors]) from None
