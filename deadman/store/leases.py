"""The worker's lease lifecycle as parameters: claim, heartbeat, finish."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from deadman.model import (
    AttemptOutcome,
    JobState,
    check_transition,
)


@dataclass(frozen=True)
class ClaimParams:
    queue: str
    worker: str
    limit: int
    ttl_ms: int
    #: jobs rescued this many times are quarantined: claimed only alone
    quarantine_at: int = 5


@dataclass(frozen=True)
class Finish:
    """How one attempt ended, as the worker reports it (fenced by ``token``)."""

    id: int
    token: int
    state: JobState
    outcome: AttemptOutcome
    delay_ms: int = 0
    error: str | None = None
    result: Any = None

    def __post_init__(self) -> None:
        check_transition(JobState.RUNNING, self.state)


@dataclass(frozen=True)
class HeartbeatParams:
    worker: str
    hostname: str
    pid: int
    queues: Sequence[str]
    concurrency: int
    ttl_ms: int
    leases: Sequence[tuple[int, int]]  # (job id, lease token)


#: How long a handler's transaction may sit idle after its fenced completion before
#: the server ends it (see tx_idle_limit): the COMMIT follows at once, so only a
#: paused or partitioned worker ever comes near it.
FINISH_IDLE_MS = 5000


def finish_params(finishes: Sequence[Finish]) -> dict[str, Any]:
    """The batch as one JSON document (see job_finish_many) and its ids, which let
    the planner go straight to the primary key."""
    batch = [
        {
            "id": f.id,
            "token": f.token,
            "state": f.state.value,
            "outcome": f.outcome.value,
            "delay_ms": f.delay_ms,
            "error": None if f.error is None else _storable(f.error),
            "result": f.result,
        }
        for f in finishes
    ]
    return {
        "batch": json.dumps(batch, ensure_ascii=False),
        "ids": [f.id for f in finishes],
    }


def _storable(text: str) -> str:
    """An error message must never sink its batch: Postgres text cannot hold NUL, and
    a lone surrogate (from a badly decoded exception message) is not UTF-8."""
    return text.replace("\x00", "\\x00").encode("utf-8", "backslashreplace").decode("utf-8")


def claim_params(p: ClaimParams) -> dict[str, Any]:
    return {
        "queue": p.queue,
        "worker": p.worker,
        "limit": p.limit,
        "ttl_ms": p.ttl_ms,
        "quarantine_at": p.quarantine_at,
    }


def heartbeat_params(p: HeartbeatParams) -> dict[str, Any]:
    return {
        "worker": p.worker,
        "hostname": p.hostname,
        "pid": p.pid,
        "queues": list(p.queues),
        "concurrency": p.concurrency,
        "ttl_ms": p.ttl_ms,
        "ids": [i for i, _ in p.leases],
        "tokens": [t for _, t in p.leases],
    }
