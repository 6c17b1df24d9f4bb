"""The worker's side of a handoff at enqueue (DECISIONS 83, migration 0021): park free
slots, take them back, and adopt the jobs enqueues handed into them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from deadman.model import Job
from deadman.store.leases import LeaseStore


@dataclass(frozen=True)
class Park:
    """Slots ``first`` .. ``first + len(nonces) - 1`` of ``worker``, parked for its
    queues, each with its nonce (DECISIONS 86)."""

    worker: str
    queues: Sequence[str]
    #: the channel the worker LISTENs on for the ids of jobs handed to it
    channel: str
    ttl_ms: int
    first: int
    #: one per slot, in slot order: a notification that carries a slot's nonce carries
    #: a job an enqueue handed into it (nobody else can read the nonce)
    nonces: Sequence[int]


@dataclass(frozen=True, slots=True)
class Adopted:
    """A job handed to us, and how much of its lease was left when we read it."""

    job: Job
    lease_left_ms: int


@dataclass(frozen=True, slots=True)
class Unparked:
    """One slot job_unpark took back, with the job handed into it (None: none)."""

    slot: int
    job_id: int | None
    lease_token: int | None


class HandoffStore(LeaseStore):
    """park, unpark, adopt: each one statement."""

    async def worker_park(self, p: Park) -> None:
        await self._all(
            "worker_park",
            {
                "worker": p.worker,
                "queues": list(p.queues),
                "channel": p.channel,
                "ttl_ms": p.ttl_ms,
                "first": p.first,
                "nonces": list(p.nonces),
            },
            retry_s=0,
        )

    async def job_unpark(self, worker: str) -> list[Unparked]:
        rows = await self._all("job_unpark", {"worker": worker}, retry_s=0)
        return [
            Unparked(
                int(r["slot"]),
                None if r["job_id"] is None else int(r["job_id"]),
                None if r["lease_token"] is None else int(r["lease_token"]),
            )
            for r in rows
        ]

    async def job_adopt(self, worker: str, job_id: int) -> tuple[int | None, Adopted | None]:
        """The slot the job was handed into (None: no such row of ours, or already
        taken) and the job, if it is still running under that handoff's lease."""
        names, rows = await self._tuples(
            "job_adopt", {"worker": worker, "job_id": job_id}, retry_s=0
        )
        if not rows:
            return None, None
        slot = int(rows[0][names.index("slot")])
        adopted = await self._adopted(names, rows)
        return slot, (adopted[0] if adopted else None)

    async def job_handoff_close(self, worker: str, job_id: int) -> int | None:
        """Close the slot's row ``job_id`` was handed into (its job started from the
        notification); the slot, or None if the row was already closed."""
        rows = await self._all("job_handoff_close", {"worker": worker, "job_id": job_id}, retry_s=0)
        return int(rows[0]["slot"]) if rows else None

    async def job_adopt_read(self, worker: str, handed: Sequence[Unparked]) -> list[Adopted]:
        """The jobs job_unpark found in our slots, still running under their leases."""
        ids = [u.job_id for u in handed if u.job_id is not None]
        if not ids:
            return []
        tokens = [u.lease_token for u in handed if u.job_id is not None]
        names, rows = await self._tuples(
            "job_adopt_read", {"worker": worker, "ids": ids, "tokens": tokens}, retry_s=0
        )
        return await self._adopted(names, rows)

    async def _adopted(
        self, names: tuple[str, ...], rows: Sequence[Sequence[Any]]
    ) -> list[Adopted]:
        at_id, at_left = names.index("id"), names.index("lease_left_ms")
        found = [r for r in rows if r[at_id] is not None]
        left = {int(r[at_id]): int(r[at_left]) for r in found}
        # read as a claim's rows are: a row this worker cannot read ends dead at once
        return [Adopted(job, left[job.id]) for job in await self._readable(names, found)]
