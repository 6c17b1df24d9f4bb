"""One job as the store inserts it (`NewJob`, made from a validated spec), its SQL
parameters, and the verdict on its dependencies."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from psycopg.types.json import Jsonb

from deadman.errors import InvalidJob
from deadman.model import Backoff, JobState

#: the canonical JSON that request_hash fingerprints: ``json.dumps(body,
#: sort_keys=True, separators=(",", ":"), default=str)`` byte for byte (stored hashes
#: were made by it), with the encoder made once instead of at every call (~1 µs)
_HASH_JSON = json.JSONEncoder(sort_keys=True, separators=(",", ":"), default=str)
#: the canonical JSON before and after the payload, by the other fields of a request
#: (NewJob._hash_fields); bounded
_AROUND: dict[tuple[Any, ...], tuple[str, str]] = {}
_AROUND_MAX = 512


@dataclass(frozen=True)
class NewJob:
    """A job as the store inserts it: built from a validated :class:`deadman.spec.JobSpec`
    (``JobSpec.to_new_job``, ``Client.job``), so it checks nothing itself."""

    type: str
    payload: Any = None
    queue: str = "default"
    priority: int = 0
    run_at: datetime | None = None
    delay_ms: int = 0
    max_attempts: int | None = None  # None: DEADMAN_MAX_ATTEMPTS
    backoff: Backoff = field(default_factory=Backoff)
    timeout_ms: int | None = None
    idempotency_key: str | None = None
    #: ids of jobs that must succeed first (the job waits; see job_deps_lock)
    depends_on: tuple[int, ...] = ()
    #: schedule-to-start: not started by then, the job ends dead ('expired')
    start_by: datetime | None = None
    #: total across retries: no attempt starts after it ('deadline')
    deadline: datetime | None = None
    heartbeat_timeout_ms: int | None = None
    #: the flow-control key: a limit on that key (deadman.limits) bounds its jobs
    limit_key: str | None = None
    #: the enqueuer's W3C trace context ({"traceparent": ..., "tracestate": ...}), as
    #: deadman.tracing.carrier checked it; not part of the request (a replay sent from
    #: another trace is the same request), so not in request_hash
    trace_context: dict[str, str] | None = None

    def request_hash(self) -> str:
        """A fingerprint of what was asked, to tell a replay from a different request:
        the SHA-256 of :meth:`_hash_body` as canonical JSON. A bulk enqueue's jobs
        differ in their payload alone, so the JSON around the payload is made once per
        set of other fields (``_around_payload``) and only the payload is encoded per
        job; the text is the whole body's, byte for byte (sorted keys, no spaces:
        the keys before "payload", the payload, the keys after). DECISIONS 93."""
        head, tail = _around_payload(self)
        text = head + _HASH_JSON.encode(self.payload) + tail
        return hashlib.sha256(text.encode()).hexdigest()

    def _hash_fields(self) -> tuple[Any, ...]:
        """Every field of the request but its payload, each int-like value with its
        exact type (``True`` hashes as ``1`` but is written ``true``)."""
        return (
            self.type,
            self.queue,
            type(self.priority),
            self.priority,
            self.run_at,
            type(self.delay_ms),
            self.delay_ms,
            type(self.max_attempts),
            self.max_attempts,
            self.backoff,
            type(self.timeout_ms),
            self.timeout_ms,
            self.depends_on,
            self.start_by,
            self.deadline,
            type(self.heartbeat_timeout_ms),
            self.heartbeat_timeout_ms,
            self.limit_key,
        )

    def _hash_body(self) -> dict[str, Any]:
        """What request_hash fingerprints, payload included."""
        body = {
            "type": self.type,
            "payload": self.payload,
            "queue": self.queue,
            "priority": self.priority,
            "run_at": self.run_at.astimezone(UTC).isoformat() if self.run_at else None,
            "delay_ms": self.delay_ms,
            "max_attempts": self.max_attempts,
            "backoff": self.backoff.to_json(),
            "timeout_ms": self.timeout_ms,
        }
        # Only when given: the hashes of jobs that do not use them stay as they were.
        if self.depends_on:
            body["depends_on"] = list(self.depends_on)
        for name in ("start_by", "deadline"):
            value = getattr(self, name)
            if value is not None:
                body[name] = value.astimezone(UTC).isoformat()
        if self.heartbeat_timeout_ms is not None:
            body["heartbeat_timeout_ms"] = self.heartbeat_timeout_ms
        if self.limit_key is not None:
            body["limit_key"] = self.limit_key
        return body

    def params(
        self,
        default_max_attempts: int,
        *,
        pending_deps: int = 0,
        upstream_error: str | None = None,
    ) -> dict[str, Any]:
        """job_insert's parameters (job_insert_handoff reads those it has);
        ``pending_deps``/``upstream_error`` come from job_deps_lock (see
        :func:`deps_verdict`). The request's fingerprint only matters (and is only
        computed) when there is an idempotency key."""
        return {
            "type": self.type,
            "queue": self.queue,
            "priority": self.priority,
            "payload": Jsonb(self.payload),
            "run_at": self.run_at,
            "delay_ms": self.delay_ms,
            "max_attempts": self.max_attempts or default_max_attempts,
            "backoff": Jsonb(self.backoff.stored()),
            "timeout_ms": self.timeout_ms,
            "idempotency_key": self.idempotency_key,
            "request_hash": self.request_hash() if self.idempotency_key else None,
            "pending_deps": pending_deps,
            "upstream_error": upstream_error,
            "start_by": self.start_by,
            "deadline": self.deadline,
            "heartbeat_timeout_ms": self.heartbeat_timeout_ms,
            "limit_key": self.limit_key,
            "trace_context": self.trace_jsonb,
        }

    @property
    def trace_jsonb(self) -> Jsonb | None:
        """The trace context as a jsonb parameter; None is SQL NULL (never JSON null)."""
        return None if self.trace_context is None else Jsonb(self.trace_context)


def deps_verdict(wanted: Sequence[int], rows: Sequence[Any]) -> tuple[int, str | None]:
    """From job_deps_lock's rows: (dependencies not yet succeeded, the reason to be
    born cancelled if one already ended dead or cancelled). Unknown ids: InvalidJob."""
    found = {int(r["id"]): r for r in rows}
    missing = [i for i in wanted if i not in found]
    if missing:
        raise UnknownDependency(missing)
    pending = sum(1 for r in found.values() if r["state"] != JobState.SUCCEEDED.value)
    failed = sorted(
        (i, r) for i, r in found.items() if r["state"] in (JobState.DEAD, JobState.CANCELLED)
    )
    if failed:
        _, row = failed[0]
        return 0, f"upstream {row['name']} {row['state']}"
    return pending, None


class UnknownDependency(InvalidJob):
    """``depends_on`` names jobs that do not exist (or were pruned); ``index``: which
    job of a batch."""

    def __init__(self, ids: Sequence[int], index: int | None = None) -> None:
        super().__init__("depends_on names unknown jobs: " + ", ".join(map(str, ids)))
        self.ids = tuple(ids)
        self.index = index


def job_columns(jobs: Sequence[NewJob], default_max_attempts: int) -> dict[str, list[Any]]:
    """The job columns as arrays, one element per job: what job_insert_many_returning
    and workflow_insert unnest (each adds its own: keys, dependencies, node names)."""
    return {
        "types": [j.type for j in jobs],
        "queues": [j.queue for j in jobs],
        "priorities": [j.priority for j in jobs],
        "payloads": [Jsonb(j.payload) for j in jobs],
        "max_attempts": [j.max_attempts or default_max_attempts for j in jobs],
        "backoffs": [Jsonb(j.backoff.stored()) for j in jobs],
        "timeouts_ms": [j.timeout_ms for j in jobs],
        "run_ats": [j.run_at for j in jobs],
        "delays_ms": [j.delay_ms for j in jobs],
        "start_bys": [j.start_by for j in jobs],
        "deadlines": [j.deadline for j in jobs],
        "heartbeat_timeouts_ms": [j.heartbeat_timeout_ms for j in jobs],
        "limit_keys": [j.limit_key for j in jobs],
        "trace_contexts": [j.trace_jsonb for j in jobs],
    }


def _around_payload(job: NewJob) -> tuple[str, str]:
    """The canonical JSON of ``job``'s request body before its payload's value and
    after it, remembered by the request's other fields (NewJob._hash_fields). Sorted
    keys and no spaces make the body's text: the keys before "payload" as an object
    without its closing brace, then ``"payload":`` (after a comma if any key came
    first), the payload, then the keys after it as an object without its opening
    brace and after a comma (or the closing brace alone)."""
    fields = job._hash_fields()
    found = _AROUND.get(fields)
    if found is not None:
        return found
    body = job._hash_body()
    del body["payload"]
    before = _HASH_JSON.encode({k: v for k, v in body.items() if k < "payload"})
    after = _HASH_JSON.encode({k: v for k, v in body.items() if k > "payload"})
    head = before[:-1] + ("," if before != "{}" else "") + '"payload":'
    tail = "," + after[1:] if after != "{}" else "}"
    if len(_AROUND) >= _AROUND_MAX:
        _AROUND.clear()
    _AROUND[fields] = (head, tail)
    return head, tail
