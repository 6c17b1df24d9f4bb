"""What a client may set as a flow-control limit (``LimitSpec``): the body of
``PUT /limits/{key}``, and what ``Client.set_limit`` and ``deadman limits set`` check."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated, ClassVar

from pydantic import ConfigDict, Field

from deadman import bounds as b
from deadman.spec.fields import ACCEPTS_NULL, Name, Rule, Whole
from deadman.spec.job import Spec
from deadman.storable import FieldError
from deadman.store.limits import LimitParams

Concurrency = Annotated[
    int,
    Field(ge=1, le=b.LIMIT_CONCURRENCY_MAX, strict=True),
    Whole,
    Rule.integer(1, b.LIMIT_CONCURRENCY_MAX),
]
RateCount = Annotated[
    int, Field(ge=1, le=b.RATE_COUNT_MAX, strict=True), Whole, Rule.integer(1, b.RATE_COUNT_MAX)
]
RatePerMs = Annotated[
    int,
    Field(ge=1, le=b.RATE_PER_MS_MAX, strict=True),
    Whole,
    Rule.integer(1, b.RATE_PER_MS_MAX),
]


class RateSpec(Spec):
    """At most ``count`` starts in any window of ``per_ms`` milliseconds."""

    noun: ClassVar[str] = "a rate"
    count: RateCount
    per_ms: RatePerMs


class LimitSpec(Spec):
    """A key's limit: at most ``concurrency`` of its jobs running at once across the
    fleet, and at most ``rate.count`` starts in any ``rate.per_ms`` window; at least one
    of the two. null (or leaving it out) means no bound of that kind."""

    noun: ClassVar[str] = "a limit"
    model_config = ConfigDict(
        json_schema_extra={
            "anyOf": [
                {"required": ["concurrency"], "properties": {"concurrency": {"type": "integer"}}},
                {"required": ["rate"], "properties": {"rate": {"type": "object"}}},
            ]
        }
    )
    # null is a value here ("no bound of that kind"), unlike a spec.fields.Maybe field:
    # the OpenAPI document must say so (openapi.schemas._tidy keeps these nulls)
    concurrency: Annotated[Concurrency | None, Field(json_schema_extra=ACCEPTS_NULL)] = None
    rate: Annotated[RateSpec | None, Field(json_schema_extra=ACCEPTS_NULL)] = None

    def problems(self, prefix: str = "") -> Iterator[FieldError]:
        if self.concurrency is None and self.rate is None:
            yield {"field": prefix or "body", "message": "set concurrency, rate or both"}

    def params(self, key: str) -> LimitParams:
        """What the store writes for ``key`` (limit_put)."""
        return LimitParams(
            key=key,
            concurrency=self.concurrency,
            rate_count=None if self.rate is None else self.rate.count,
            rate_per_ms=None if self.rate is None else self.rate.per_ms,
        )


class KeyedName(Spec):
    """A limit's key, checked as the path of ``/limits/{key}`` is."""

    key: Name
