"""The rescuer's and the cleaner's parameters and results."""

from __future__ import annotations

from dataclasses import dataclass

from psycopg.rows import DictRow

from deadman.model import (
    JobState,
)


@dataclass(frozen=True)
class RescueParams:
    max_rescues: int
    limit: int = 1000
    #: a leader idle this long inside its tick's transaction loses its session
    idle_ms: int = 5000

    @property
    def quarantine_at(self) -> int:
        return quarantine_at(self.max_rescues)


def quarantine_at(max_rescues: int) -> int:
    """Rescues after which a job only runs alone (see job_rescue_expired)."""
    return max(max_rescues, 1)


@dataclass(frozen=True)
class PruneParams:
    succeeded_ms: int
    failed_ms: int
    limit: int = 1000


@dataclass(frozen=True)
class Rescued:
    id: int
    state: JobState
    queue: str
    #: the job and the lease that lapsed, for the log line (absent: not known)
    type: str = ""
    attempt: int = 0
    lease_token: int = 0
    worker: str = ""

    @classmethod
    def from_row(cls, r: DictRow) -> Rescued:
        return cls(
            int(r["id"]),
            JobState(r["state"]),
            r["queue"],
            r.get("type") or "",
            int(r.get("attempt") or 0),
            int(r.get("lease_token") or 0),
            r.get("lease_worker") or "",
        )
