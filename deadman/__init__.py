"""Deadman: a Postgres-backed job queue with fenced leases.

Execution is at-least-once; effects written through ``ctx.transaction()`` are
exactly-once, because the job's completion commits in the same transaction,
guarded by the lease's fencing token.

The names below are imported when first used (PEP 562), not with the package: every
``deadman`` command and worker process imports ``deadman`` first, and most need few
of them (DECISIONS 101).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from deadman.aclient import AsyncClient
    from deadman.client import Client
    from deadman.errors import DeadmanError, DuplicateKey, LeaseLost, UnsupportedConnection
    from deadman.model import Backoff, Job, JobState, Workflow, WorkflowState
    from deadman.registry import Registry
    from deadman.spec import BatchSpec, JobSpec, SpecError, WorkflowSpec
    from deadman.waiting import WaitTimeout
    from deadman.worker.context import JobContext

#: each public name and the module it comes from
_HOMES = {
    "AsyncClient": "deadman.aclient",
    "Backoff": "deadman.model",
    "BatchSpec": "deadman.spec",
    "Client": "deadman.client",
    "DeadmanError": "deadman.errors",
    "DuplicateKey": "deadman.errors",
    "Job": "deadman.model",
    "JobContext": "deadman.worker.context",
    "JobSpec": "deadman.spec",
    "JobState": "deadman.model",
    "LeaseLost": "deadman.errors",
    "Registry": "deadman.registry",
    "SpecError": "deadman.spec",
    "UnsupportedConnection": "deadman.errors",
    "WaitTimeout": "deadman.waiting",
    "Workflow": "deadman.model",
    "WorkflowSpec": "deadman.spec",
    "WorkflowState": "deadman.model",
}

__all__ = [
    "AsyncClient",
    "Backoff",
    "BatchSpec",
    "Client",
    "DeadmanError",
    "DuplicateKey",
    "Job",
    "JobContext",
    "JobSpec",
    "JobState",
    "LeaseLost",
    "Registry",
    "SpecError",
    "UnsupportedConnection",
    "WaitTimeout",
    "Workflow",
    "WorkflowSpec",
    "WorkflowState",
]
__version__ = "0.1.0"


if not TYPE_CHECKING:  # hidden from type checkers: a misspelt name stays an error there

    def __getattr__(name: str) -> object:
        home = _HOMES.get(name)
        if home is None:
            raise AttributeError(f"module 'deadman' has no attribute {name!r}")
        value = getattr(importlib.import_module(home), name)
        globals()[name] = value  # the next lookup is a plain one
        return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_HOMES])
