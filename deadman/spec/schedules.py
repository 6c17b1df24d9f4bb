"""What a client may set as a schedule (``ScheduleSpec``): the body of
``PUT /schedules/{name}``, and what ``Registry.periodic`` declares."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Annotated, Any, ClassVar, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError
from pydantic import BeforeValidator, ConfigDict, Field

from deadman import bounds as b
from deadman.spec.fields import Rule, Whole, refuse
from deadman.spec.job import JobFields, Spec
from deadman.storable import FieldError
from deadman.store.schedules import ScheduleParams
from deadman.ticks import Rule as TickRule

CRON_RULE = "must be a cron expression of 5 fields, e.g. */5 * * * *"
TIMEZONE_RULE = "must be an IANA time zone, e.g. Europe/Berlin"


def _cron(value: Any) -> Any:
    if not isinstance(value, str) or not 1 <= len(value) <= b.CRON_MAX_LEN:
        raise refuse(CRON_RULE)
    try:
        CronSim(value, datetime(2000, 1, 1, tzinfo=UTC))
    except (CronSimError, ValueError, KeyError, IndexError):
        raise refuse(CRON_RULE) from None
    return value


def _timezone(value: Any) -> Any:
    if not isinstance(value, str) or not 1 <= len(value) <= b.TIMEZONE_MAX_LEN:
        raise refuse(TIMEZONE_RULE)
    try:
        ZoneInfo(value)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise refuse(TIMEZONE_RULE) from None
    return value


Cron = Annotated[str, BeforeValidator(_cron), Field(max_length=b.CRON_MAX_LEN)]
TimeZone = Annotated[str, BeforeValidator(_timezone), Field(max_length=b.TIMEZONE_MAX_LEN)]
EveryMs = Annotated[
    int,
    Field(ge=b.EVERY_MS_MIN, le=b.EVERY_MS_MAX, strict=True),
    Whole,
    Rule.integer(b.EVERY_MS_MIN, b.EVERY_MS_MAX),
]


class ScheduleSpec(Spec):
    """Enqueue ``job`` at every tick: of ``cron`` in ``timezone``, or every
    ``every_ms`` milliseconds (since the Unix epoch); exactly one of the two. After
    downtime, ``latest`` enqueues the most recent missed tick once, ``none`` skips to
    the next."""

    noun: ClassVar[str] = "a schedule"
    model_config = ConfigDict(
        json_schema_extra={
            "oneOf": [
                {
                    "required": ["cron"],
                    "properties": {"cron": {"type": "string"}, "every_ms": {"type": "null"}},
                },
                {
                    "required": ["every_ms"],
                    "properties": {"every_ms": {"type": "integer"}, "cron": {"type": "null"}},
                },
            ]
        }
    )
    cron: Cron | None = None
    every_ms: EveryMs | None = None
    timezone: TimeZone = "UTC"
    job: JobFields  # the POST /jobs body, without depends_on (no tick waits on a job)
    catch_up: Literal["none", "latest"] = "latest"

    def problems(self, prefix: str = "") -> Iterator[FieldError]:
        if (self.cron is None) == (self.every_ms is None):
            yield {"field": f"{prefix}cron", "message": "give exactly one of cron and every_ms"}
        yield from self.job.problems(f"{prefix}job.")
        for fixed in ("run_at", "start_by", "deadline"):  # one instant, not one per tick
            if getattr(self.job, fixed) is not None:
                yield {
                    "field": f"{prefix}job.{fixed}",
                    "message": "a scheduled job starts at its tick (use delay_ms)",
                }

    @property
    def rule(self) -> TickRule:
        return TickRule(self.cron, self.every_ms, self.timezone)

    def params(self, name: str, now: datetime) -> ScheduleParams:
        """What the store writes for ``name``: its first tick is the first after ``now``
        (the database's clock)."""
        return ScheduleParams(
            name=name,
            cron=self.cron,
            every_ms=self.every_ms,
            timezone=self.timezone,
            job=self.job.model_dump(mode="json", exclude_unset=True, by_alias=True),
            catch_up=self.catch_up,
            next_fire_at=self.rule.next_after(now),
        )
