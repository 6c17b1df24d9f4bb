"""Grouped single submissions (``job_insert_grouped``): the API's group commit writes
the ``POST /jobs`` requests that arrived together in one statement, and hands each
caller the row made for it, or None where its idempotency key was already taken, as
:meth:`AsyncStore.job_insert` would have."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from deadman.db.queries import QUERIES
from deadman.errors import translate
from deadman.model import Job
from deadman.store.async_base import AsyncBase
from deadman.store.jobs import NewJob
from deadman.store.plans import jobs_of


def grouped_order(jobs: Sequence[NewJob]) -> list[int]:
    """The order the rows are inserted in, as indexes into ``jobs``: keyed jobs by key
    (every group takes the keys it shares with another group in the same order, so
    two groups wait on each other rather than deadlock), then key-less ones as given."""
    keyed = sorted(
        (i for i, j in enumerate(jobs) if j.idempotency_key is not None),
        key=lambda i: str(jobs[i].idempotency_key),
    )
    return keyed + [i for i, j in enumerate(jobs) if j.idempotency_key is None]


def grouped_params(jobs: Sequence[NewJob], default_max_attempts: int) -> dict[str, Any]:
    """job_insert_grouped's one parameter: the group as one JSON document, for ``jobs``
    already in :func:`grouped_order`. Its values are those job_insert binds one by
    one (timestamps as ISO 8601 with their offset)."""
    group = [
        {
            "ord": i,
            "type": j.type,
            "queue": j.queue,
            "priority": j.priority,
            "payload": j.payload,
            "max_attempts": j.max_attempts or default_max_attempts,
            "backoff": j.backoff.stored(),
            "timeout_ms": j.timeout_ms,
            "run_at": _iso(j.run_at),
            "delay_ms": j.delay_ms,
            "idempotency_key": j.idempotency_key,
            "request_hash": j.request_hash() if j.idempotency_key else None,
            "start_by": _iso(j.start_by),
            "deadline": _iso(j.deadline),
            "heartbeat_timeout_ms": j.heartbeat_timeout_ms,
            "limit_key": j.limit_key,
            "trace_context": j.trace_context,
        }
        for i, j in enumerate(jobs)
    ]
    return {"group": json.dumps(group, ensure_ascii=False)}


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def match_grouped(jobs: Sequence[NewJob], inserted: Sequence[Job]) -> list[Job | None]:
    """Each input's row: keyed ones by key, key-less ones by id order (the insert's
    order, :func:`grouped_order`'s last part); None where the key was taken."""
    by_key = {j.idempotency_key: j for j in inserted if j.idempotency_key is not None}
    unkeyed = iter(sorted((j for j in inserted if j.idempotency_key is None), key=lambda j: j.id))
    return [
        next(unkeyed) if new.idempotency_key is None else by_key.get(new.idempotency_key)
        for new in jobs
    ]


async def job_insert_grouped(
    store: AsyncBase, jobs: Sequence[NewJob], default_max_attempts: int
) -> list[Job | None]:
    """Insert ``jobs`` (no depends_on; idempotency keys unique among them) in one
    autocommit statement: all committed, durable, when this returns, or none (an
    error). Index by index with ``jobs``: the new job, or None if its key is taken.
    Never retried here: a lost acknowledgement leaves the outcome unknown, and the
    caller must not insert key-less jobs again (see deadman.api.group_commit)."""
    order = grouped_order(jobs)
    ordered = [jobs[i] for i in order]
    params = grouped_params(ordered, default_max_attempts)
    with translate():
        async with store.pool.connection() as conn:
            cur = await conn.execute(QUERIES["job_insert_grouped"], params)
            rows = await cur.fetchall()
    matched = match_grouped(ordered, jobs_of(rows))
    out: list[Job | None] = [None] * len(jobs)
    for i, job in zip(order, matched, strict=True):
        out[i] = job
    return out
