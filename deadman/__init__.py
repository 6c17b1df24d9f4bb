"""Deadman: a Postgres-backed job queue with fenced leases.

Execution is at-least-once; effects written through ``ctx.transaction()`` are
exactly-once, because the job's completion commits in the same transaction,
guarded by the lease's fencing token.
"""

from __future__ import annotations

from deadman.aclient import AsyncClient
from deadman.client import Client
from deadman.errors import DeadmanError, DuplicateKey, LeaseLost, UnsupportedConnection
from deadman.model import Backoff, Job, JobState, Workflow, WorkflowState
from deadman.registry import Registry
from deadman.spec import BatchSpec, JobSpec, SpecError, WorkflowSpec
from deadman.waiting import WaitTimeout
from deadman.worker.context import JobContext

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
