"""The store: the only seam between Deadman and Postgres.

One method per named query in ``db/queries.sql`` (noun_verb: ``job_insert``,
``job_claim``, ...), parameters as frozen dataclasses where there are more than
two. Psycopg errors become Deadman errors where a connection is used, and nowhere
else (``deadman.errors.translate``).

A package of small modules by noun: what a client submits (``jobs``, ``batches``,
``workflows``), the worker's lease lifecycle (``leases``), the rescuer's and
cleaner's parameters (``maintenance``), listing (``reads``). The statements the
clients and both stores share are written once as plans (``plans``; the runners in
``plan``: sync and async, on any connection); they run in ``AsyncStore`` (the worker
and the API, over a pool; its connection handling in ``async_base``), ``SyncStore``
(sync handlers, on the caller's connection) and ``deadman.Client`` /
``deadman.AsyncClient`` (on their own pool, or the caller's connection so that an
enqueue joins the caller's transaction). Everything is importable from here.
"""

from __future__ import annotations

from deadman.store.async_base import AsyncBase
from deadman.store.async_store import AsyncStore
from deadman.store.batches import (
    BatchInserted,
    batch_dependencies,
    batch_edges,
    batch_params,
    batch_verdicts,
    match_batch,
)
from deadman.store.conn import AsyncConn, SyncConn
from deadman.store.jobs import NewJob, UnknownDependency, deps_verdict
from deadman.store.leases import (
    FINISH_IDLE_MS,
    ClaimLeft,
    ClaimParams,
    Finish,
    HeartbeatParams,
    claim_params,
    finish_params,
    heartbeat_params,
    succeed_params,
)
from deadman.store.maintenance import PruneParams, Rescued, RescueParams, quarantine_at
from deadman.store.reads import FINISHED_COUNT_CAP, JobPage, ListParams
from deadman.store.sync_store import SyncStore, is_transient
from deadman.store.workflows import (
    InvalidWorkflow,
    NewWorkflow,
    workflow_params,
)

__all__ = [
    "FINISHED_COUNT_CAP",
    "FINISH_IDLE_MS",
    "AsyncBase",
    "AsyncConn",
    "AsyncStore",
    "BatchInserted",
    "ClaimLeft",
    "ClaimParams",
    "Finish",
    "HeartbeatParams",
    "InvalidWorkflow",
    "JobPage",
    "ListParams",
    "NewJob",
    "NewWorkflow",
    "PruneParams",
    "RescueParams",
    "Rescued",
    "SyncConn",
    "SyncStore",
    "UnknownDependency",
    "batch_dependencies",
    "batch_edges",
    "batch_params",
    "batch_verdicts",
    "claim_params",
    "deps_verdict",
    "finish_params",
    "heartbeat_params",
    "is_transient",
    "match_batch",
    "quarantine_at",
    "succeed_params",
    "workflow_params",
]
