"""Batches of jobs (POST /jobs/batch): parameters, dependencies, and matching
the inserted rows (and replays) back to the request."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from deadman.model import (
    Job,
)
from deadman.store.jobs import NewJob, UnknownDependency, deps_verdict, job_columns


@dataclass(frozen=True)
class BatchInserted:
    """The outcome of a batch insert, index by index with the input.

    ``jobs[i]`` is the row for input ``i`` and ``created[i]`` False when it was a
    replay of an existing job. When ``mismatched`` (inputs whose idempotency key
    belongs to a job made from a different request) or ``vanished`` (a replayed row
    deleted meanwhile) is non-empty, nothing was committed and ``jobs`` is partial.
    """

    jobs: tuple[Job, ...]
    created: tuple[bool, ...]
    mismatched: tuple[int, ...] = ()
    vanished: tuple[int, ...] = ()


def batch_params(
    jobs: Sequence[NewJob],
    default_max_attempts: int,
    verdicts: Sequence[tuple[int, str | None]] | None = None,
) -> dict[str, Any]:
    """job_insert_many_returning's arrays; ``verdicts[i]`` is job i's (pending
    dependencies, upstream error) from :func:`batch_verdicts` (none: no depends_on)."""
    verdicts = verdicts or [(0, None)] * len(jobs)
    return {
        "ords": list(range(len(jobs))),
        **job_columns(jobs, default_max_attempts),
        "idempotency_keys": [j.idempotency_key for j in jobs],
        "request_hashes": [j.request_hash() if j.idempotency_key else None for j in jobs],
        "pending_deps": [v[0] for v in verdicts],
        "upstream_errors": [v[1] for v in verdicts],
    }


def batch_dependencies(jobs: Sequence[NewJob]) -> list[int]:
    """Every job id the batch depends on, once, in id order (the lock order)."""
    return sorted({d for j in jobs for d in j.depends_on})


def batch_verdicts(jobs: Sequence[NewJob], rows: Sequence[Any]) -> list[tuple[int, str | None]]:
    """deps_verdict for each job of a batch from one job_deps_lock of all their
    dependencies; an unknown id raises UnknownDependency naming the job's index."""
    verdicts = []
    for i, job in enumerate(jobs):
        wanted = set(job.depends_on)
        try:
            verdicts.append(
                deps_verdict(job.depends_on, [r for r in rows if int(r["id"]) in wanted])
            )
        except UnknownDependency as exc:
            raise UnknownDependency(exc.ids, index=i) from None
    return verdicts


def batch_edges(jobs: Sequence[NewJob], result: BatchInserted) -> dict[str, list[int]]:
    """job_deps_insert_many's pairs: the dependencies of each job the batch created."""
    job_ids: list[int] = []
    deps: list[int] = []
    for new, row, created in zip(jobs, result.jobs, result.created, strict=True):
        if created:
            job_ids += [row.id] * len(new.depends_on)
            deps += new.depends_on
    return {"job_ids": job_ids, "depends_on": deps}


def match_batch(
    jobs: Sequence[NewJob], inserted: Sequence[Job], existing: Sequence[Job]
) -> BatchInserted:
    """Pair each input with its row: inserted rows by key, or (key-less) by id order,
    which is input order (job_insert_many_returning inserts in that order); skipped
    keyed rows with the existing job, a replay only if its request hash matches."""
    by_key = {j.idempotency_key: j for j in inserted if j.idempotency_key is not None}
    unkeyed = iter(sorted((j for j in inserted if j.idempotency_key is None), key=lambda j: j.id))
    old = {j.idempotency_key: j for j in existing}
    out: list[Job] = []
    created: list[bool] = []
    mismatched: list[int] = []
    vanished: list[int] = []
    for i, new in enumerate(jobs):
        key = new.idempotency_key
        if key is None:
            out.append(next(unkeyed))
            created.append(True)
        elif key in by_key:
            out.append(by_key[key])
            created.append(True)
        elif key in old:
            if old[key].request_hash == new.request_hash():
                out.append(old[key])
                created.append(False)
            else:
                mismatched.append(i)
        else:
            vanished.append(i)
    return BatchInserted(tuple(out), tuple(created), tuple(mismatched), tuple(vanished))
