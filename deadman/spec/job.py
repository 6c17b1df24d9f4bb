"""What a client may submit as a job (``JobSpec``), a batch item and a batch, and its
retry policy (``BackoffSpec``): the body of ``POST /jobs`` and ``POST /jobs/batch``,
what ``Client.job`` and ``deadman enqueue`` check, and the OpenAPI components."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from deadman import bounds as b
from deadman.model import DEFAULT_BACKOFF, Backoff
from deadman.spec.fields import (
    BackoffMs,
    DelayMs,
    JobIds,
    Key,
    MaxAttempts,
    Maybe,
    Name,
    Priority,
    Rule,
    TimeoutMs,
    Timestamp,
)
from deadman.storable import FieldError
from deadman.store.jobs import NewJob


def _optional(description: str) -> Any:
    """An optional field: None when left out (what that means, or what a value does, is
    in ``description``, which the OpenAPI document shows)."""
    return Field(None, description=description)


class Spec(BaseModel):
    """Unknown fields are refused; no type is coerced into another ("5" is not 5)."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)
    #: how a refusal of an unknown field names this object: "is not a field of a job"
    noun: ClassVar[str] = "this object"

    def problems(self, prefix: str = "") -> Iterator[FieldError]:
        """Rules across fields, once each field is valid on its own."""
        return iter(())


class BackoffSpec(Spec):
    """Delay after a failed attempt. exponential: base_ms * 2^(attempt-1) capped at
    max_ms; fixed: base_ms. full jitter: uniform in [0, delay]."""

    noun: ClassVar[str] = "backoff"
    strategy: Literal["exponential", "fixed"] = "exponential"
    base_ms: BackoffMs = 1000
    max_ms: Maybe[BackoffMs] = _optional(
        "At least base_ms. Default: the larger of 300000 and base_ms."
    )
    jitter: Literal["full", "none"] = "full"

    def problems(self, prefix: str = "") -> Iterator[FieldError]:
        if self.max_ms is not None and self.max_ms < self.base_ms:
            yield {"field": f"{prefix}max_ms", "message": "must be at least base_ms"}

    def to_backoff(self) -> Backoff:
        # Without max_ms, the default cap (300 s) rises to base_ms rather than undercut it.
        max_ms = self.max_ms if self.max_ms is not None else max(300_000, self.base_ms)
        return Backoff(self.strategy, self.base_ms, max_ms, self.jitter)


class JobFields(Spec):
    """The fields of every job, whether alone, in a batch or a workflow node."""

    noun: ClassVar[str] = "a job"
    model_config = ConfigDict(json_schema_extra={"not": {"required": ["run_at", "delay_ms"]}})

    type: Name = Field(description="The handler to run: 1-128 of [A-Za-z0-9_.:-].")
    payload: Any = _optional("Any JSON; the handler's input. Default null.")
    queue: Name = "default"
    priority: Priority = Field(0, description="Higher runs first.")
    max_attempts: Maybe[MaxAttempts] = _optional("Default: the server's DEADMAN_MAX_ATTEMPTS.")
    backoff: Maybe[BackoffSpec] = None
    run_at: Maybe[Timestamp] = _optional(
        "RFC 3339 with an offset (Z or +hh:mm). Not with delay_ms. "
        "Between 0001-01-02 and 9999-12-30."
    )
    delay_ms: DelayMs = Field(
        0, description="Run this many milliseconds from now. Not with run_at."
    )
    timeout_ms: Maybe[TimeoutMs] = _optional("Cancel an attempt that runs longer.")
    start_by: Maybe[Timestamp] = _optional(
        "Schedule-to-start: a job not started by then ends dead with "
        "last_error `expired`, without running."
    )
    deadline: Maybe[Timestamp] = _optional(
        "Total, across retries: no attempt starts after it; the job then "
        "ends dead with last_error `deadline`."
    )
    heartbeat_timeout_ms: Maybe[TimeoutMs] = _optional(
        "A handler that stops calling ctx.heartbeat() for this long is "
        "treated as hung: its attempt ends timed_out and the job retries as usual."
    )

    limit_key: Maybe[Name] = _optional(
        "Flow control: a limit on this key (PUT /limits/{key}) bounds how many "
        "of its jobs run at once and how often they start. No limit: unlimited."
    )

    def problems(self, prefix: str = "") -> Iterator[FieldError]:
        if {"run_at", "delay_ms"} <= self.model_fields_set:  # as the schema's "not"
            yield {"field": f"{prefix}delay_ms", "message": "give run_at or delay_ms, not both"}
        if self.backoff is not None:
            yield from self.backoff.problems(f"{prefix}backoff.")

    def to_new_job(self, idempotency_key: str | None = None) -> NewJob:
        return NewJob(
            type=self.type,
            payload=self.payload,
            queue=self.queue,
            priority=self.priority,
            run_at=self.run_at,
            delay_ms=self.delay_ms,
            max_attempts=self.max_attempts,
            backoff=DEFAULT_BACKOFF if self.backoff is None else self.backoff.to_backoff(),
            timeout_ms=self.timeout_ms,
            idempotency_key=idempotency_key,
            depends_on=tuple(getattr(self, "depends_on", ())),
            start_by=self.start_by,
            deadline=self.deadline,
            heartbeat_timeout_ms=self.heartbeat_timeout_ms,
            limit_key=self.limit_key,
        )


class JobSpec(JobFields):
    """One job: the body of ``POST /jobs``, and what ``Client.job`` checks."""

    depends_on: JobIds = Field(
        default_factory=list,
        description="Ids of jobs that must succeed first; the job is `waiting` until then, "
        "and cancelled (`upstream job <id> <state>`) if one ends dead or cancelled. An "
        "unknown id is 422.",
    )


class BatchJobSpec(JobSpec):
    """One job of a batch: a job with its own idempotency key."""

    idempotency_key: Maybe[Key] = _optional(
        "Like the Idempotency-Key header of POST /jobs; unique within the batch."
    )

    def to_new_job(self, idempotency_key: str | None = None) -> NewJob:
        return super().to_new_job(idempotency_key or self.idempotency_key)


class BatchSpec(Spec):
    """``POST /jobs/batch``: 1 to 1000 jobs in one transaction."""

    noun: ClassVar[str] = "a batch"
    jobs: Annotated[
        list[BatchJobSpec],
        Field(min_length=1, max_length=b.MAX_BATCH),
        Rule.array(1, b.MAX_BATCH, "jobs"),
    ]

    def problems(self, prefix: str = "") -> Iterator[FieldError]:
        first_use: dict[str, int] = {}
        for i, job in enumerate(self.jobs):
            yield from job.problems(f"{prefix}jobs[{i}].")
            key = job.idempotency_key
            if key is not None and first_use.setdefault(key, i) != i:
                yield {
                    "field": f"{prefix}jobs[{i}].idempotency_key",
                    "message": f"repeats the key of jobs[{first_use[key]}]",
                }

    def to_new_jobs(self) -> list[NewJob]:
        return [job.to_new_job() for job in self.jobs]
