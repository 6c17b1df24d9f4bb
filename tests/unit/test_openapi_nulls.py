"""Where null is a value, the OpenAPI document says so. A limit's ``concurrency`` or
``rate`` may be null ("no bound of that kind") and PUT /limits/{key} accepts it; the
document used to drop the null (as it rightly does for the fields that refuse it), so
a schemathesis run of the fresh-clone suite sent ``{"rate": {...}, "concurrency":
null}`` as invalid data and failed when it was accepted."""

from __future__ import annotations

from typing import Any

from deadman.api.openapi import document
from deadman.config import Settings
from deadman.spec.limits import LimitSpec


def _schemas() -> dict[str, Any]:
    schemas: dict[str, Any] = document(Settings())["components"]["schemas"]
    return schemas


def test_a_limit_s_bounds_may_be_null_in_the_document_as_in_the_spec() -> None:
    props = _schemas()["LimitSpec"]["properties"]
    for name in ("concurrency", "rate"):
        assert {"type": "null"} in props[name]["anyOf"], name
        assert "x-accepts-null" not in props[name]  # our mark, not published
    spec = LimitSpec.model_validate({"concurrency": None, "rate": {"count": 1, "per_ms": 10}})
    assert spec.concurrency is None


def test_fields_that_refuse_null_still_leave_it_out() -> None:
    job = _schemas()["JobSpec"]["properties"]
    assert "anyOf" not in job["queue"] and job["queue"].get("type") == "string"
