"""One definition of what a client may submit. Every bound is written once
(:mod:`deadman.bounds`); the HTTP API, ``Client``, the CLI and the OpenAPI
document all derive from these models, so they refuse the same input in the same words.

FastAPI users can take ``deadman.JobSpec`` as a request body and hand it to
``Client.submit``.
"""

from __future__ import annotations

from deadman.spec.errors import SpecError, validate
from deadman.spec.job import BackoffSpec, BatchJobSpec, BatchSpec, JobFields, JobSpec, Spec
from deadman.spec.limits import KeyedName, LimitSpec, RateSpec
from deadman.spec.schedules import ScheduleSpec
from deadman.spec.workflow import EdgeSpec, NodeSpec, WorkflowSpec

__all__ = [
    "BackoffSpec",
    "BatchJobSpec",
    "BatchSpec",
    "EdgeSpec",
    "JobFields",
    "JobSpec",
    "KeyedName",
    "LimitSpec",
    "NodeSpec",
    "RateSpec",
    "ScheduleSpec",
    "Spec",
    "SpecError",
    "WorkflowSpec",
    "validate",
]
