"""Rows and records to the JSON the API promises (the shapes in openapi.py).

Ids and fencing tokens are bigints: they go out as strings, because JavaScript
clients lose integer precision above 2**53. Timestamps are RFC 3339 in UTC with
microseconds and a ``Z`` (``2025-01-31T12:00:00.123456Z``), null when not yet.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from deadman import tracing
from deadman.model import Job, JobState
from deadman.store.limits import Limit
from deadman.store.schedules import Schedule

STATES: tuple[str, ...] = tuple(s.value for s in JobState)


def rfc3339(value: datetime | None) -> str | None:
    if value is None:
        return None
    # isoformat, not strftime: it pads years below 1000 to four digits as RFC 3339 needs.
    return value.astimezone(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def job_json(job: Job) -> dict[str, Any]:
    lease = None
    if job.lease is not None:
        lease = {
            "worker": job.lease.worker,
            "token": str(job.lease.token),
            "expires_at": rfc3339(job.lease.expires_at),
        }
    return {
        "id": str(job.id),
        "type": job.type,
        "queue": job.queue,
        "priority": job.priority,
        "payload": job.payload,
        "state": job.state.value,
        "attempt": job.attempt,
        "max_attempts": job.max_attempts,
        "run_at": rfc3339(job.run_at),
        "created_at": rfc3339(job.created_at),
        "started_at": rfc3339(job.started_at),
        "finished_at": rfc3339(job.finished_at),
        "last_error": job.last_error,
        "idempotency_key": job.idempotency_key,
        "lease": lease,
        "result": job.result,
        "workflow_id": None if job.workflow_id is None else str(job.workflow_id),
        "node": job.node,
        "start_by": rfc3339(job.start_by),
        "deadline": rfc3339(job.deadline),
        "heartbeat_timeout_ms": job.heartbeat_timeout_ms,
        "limit_key": job.limit_key,
        # checked as the worker checks it: a row written by hand may hold anything
        "trace_context": tracing.stored(job.trace_context),
    }


def workflow_json(row: Mapping[str, Any], nodes: Iterable[Job]) -> dict[str, Any]:
    """The workflow and each node's state (the full jobs are at /jobs/{id})."""
    return {
        "id": str(row["id"]),
        "name": row["name"],
        "state": row["state"],
        "created_at": rfc3339(row["created_at"]),
        "finished_at": rfc3339(row["finished_at"]),
        "nodes": [
            {
                "name": j.node,
                "job_id": str(j.id),
                "state": j.state.value,
                "last_error": j.last_error,
            }
            for j in nodes
        ],
    }


def attempt_json(row: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "attempt": int(row["attempt"]),
        "lease_token": str(row["lease_token"]),
        "worker": row["worker"],
        "started_at": rfc3339(row["started_at"]),
        "finished_at": rfc3339(row["finished_at"]),
        "outcome": row["outcome"],
        "error": row["error"],
    }


def worker_json(row: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "id": row["id"],
        "hostname": row["hostname"],
        "pid": int(row["pid"]),
        "queues": list(row["queues"]),
        "concurrency": int(row["concurrency"]),
        "started_at": rfc3339(row["started_at"]),
        "last_heartbeat_at": rfc3339(row["last_heartbeat_at"]),
        "alive": bool(row["alive"]),
        "jobs_held": int(row["jobs_held"]),
    }


def limit_json(limit: Limit) -> dict[str, Any]:
    """A limit as GET /limits/{key} shows it (the Limit schema in openapi)."""
    rate = None
    if limit.rate_count is not None:
        rate = {"count": limit.rate_count, "per_ms": limit.rate_per_ms}
    return {
        "key": limit.key,
        "concurrency": limit.concurrency,
        "rate": rate,
        "running": limit.running,
        "available": limit.available,
    }


def schedule_json(schedule: Schedule) -> dict[str, Any]:
    """A schedule as GET /schedules/{name} shows it (the Schedule schema in openapi)."""
    return {
        "name": schedule.name,
        **schedule.body(),
        "paused": schedule.paused,
        "next_fire_at": rfc3339(schedule.next_fire_at),
        "last_fire_at": rfc3339(schedule.last_fire_at),
        "last_job_id": None if schedule.last_job_id is None else str(schedule.last_job_id),
    }
