"""Submission with ``Idempotency-Key``, after the IETF draft "The Idempotency-Key HTTP
Header Field".

The key is stored on the job row under a unique index, with a fingerprint of the
request (``NewJob.request_hash``), so a key lives exactly as long as its job. The
insert is ``ON CONFLICT DO NOTHING``: of N concurrent identical requests one inserts
and the others wait on the index entry until it commits, insert nothing, then read
the committed row. So there is exactly one job, and every caller gets its id. A
repeat of the same request is a replay (200, the same job); the same key with a
different request is refused (422), because answering it with someone else's job
would be a lie either way.

The fingerprint covers the request after defaults are applied: leaving out
``"queue": "default"`` is the same request as sending it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from deadman.api.problems import Problem
from deadman.model import Job
from deadman.storable import FieldError
from deadman.store import AsyncStore, NewJob

# The row of a replayed key can vanish between our insert and our read only if
# retention deletes it in that instant; then the next insert simply succeeds.
_ATTEMPTS = 3


@dataclass(frozen=True)
class Submitted:
    job: Job
    replayed: bool


def reused(key: str, existing: str | None) -> Problem:
    """422: ``key`` already made ``existing`` (e.g. "job 12") from a different request."""
    where = f" ({existing})" if existing is not None else ""
    return Problem(
        "idempotency-key-reused",
        f"the Idempotency-Key {key!r} was already used for a different request{where}; "
        "use a new key for a new request",
        errors=[{"field": "Idempotency-Key", "message": "already used for a different request"}],
    )


async def submit(
    store: AsyncStore, new: NewJob, insert: Callable[[NewJob], Awaitable[Job | None]]
) -> Submitted:
    """Create the job with ``insert`` (None: its key is taken; the API's is its group
    commit, deadman.api.group_commit), or return the one this key already made from
    the same request."""
    for _ in range(_ATTEMPTS):
        job = await insert(new)
        if job is not None:
            return Submitted(job, replayed=False)
        replay = await find_replay(store, new)
        if replay is not None:
            return replay
    raise Problem("conflict", "the idempotency key's job changed under us; retry the request")


async def find_replay(store: AsyncStore, new: NewJob) -> Submitted | None:
    """The existing job for ``new``'s key if it is a replay; 422 if the key was used for
    another request; None if no job holds the key."""
    if new.idempotency_key is None:
        return None
    existing = await store.job_get_by_idempotency_key(new.idempotency_key)
    if existing is None:
        return None
    if existing.request_hash != new.request_hash():
        raise reused(new.idempotency_key, f"job {existing.id}")
    return Submitted(existing, replayed=True)


async def submit_batch(
    store: AsyncStore, jobs: Sequence[NewJob], default_max_attempts: int
) -> list[Submitted]:
    """All of ``jobs`` in one transaction or none; keyed items may be replays."""
    result = await store.job_insert_many_returning(jobs, default_max_attempts)
    if result.mismatched:
        errors: list[FieldError] = [
            {
                "field": f"jobs[{i}].idempotency_key",
                "message": "already used for a different request",
            }
            for i in result.mismatched
        ]
        raise Problem(
            "idempotency-key-reused",
            f"{len(errors)} idempotency key(s) were already used for different requests; "
            "nothing was created",
            errors=errors,
        )
    if result.vanished:
        raise Problem("conflict", "replayed jobs changed under us; nothing was created, retry")
    return [
        Submitted(job, not created)
        for job, created in zip(result.jobs, result.created, strict=True)
    ]
