"""What every request handler needs: the settings, and the store once it is open."""

from __future__ import annotations

from dataclasses import dataclass, field

from starlette.requests import Request

from deadman.api.group_commit import GroupCommit
from deadman.api.problems import Problem
from deadman.config import Settings
from deadman.store import AsyncStore
from deadman.waiting import AsyncWaiter


@dataclass
class ApiState:
    settings: Settings
    #: The migration version this code was written for (/ready compares).
    schema_version: int
    #: Set by the app's lifespan for as long as the app runs.
    store: AsyncStore | None = field(default=None)
    #: The long-polls' one listener (GET /jobs/{id}?wait_ms=N), on the store's pool.
    waiter: AsyncWaiter | None = field(default=None)
    #: POST /jobs's inserts, grouped (deadman.api.group_commit), on the store's pool.
    submitter: GroupCommit | None = field(default=None)


@dataclass(frozen=True)
class Ready:
    """An ``ApiState`` whose store is open: what route handlers work with."""

    settings: Settings
    schema_version: int
    store: AsyncStore
    waiter: AsyncWaiter
    submitter: GroupCommit


def api_state(request: Request) -> Ready:
    state: ApiState = request.app.state.deadman
    if state.store is None or state.waiter is None or state.submitter is None:
        # only outside the lifespan
        raise Problem(
            "not-ready", "the server is starting or stopping", headers={"Retry-After": "1"}
        )
    return Ready(state.settings, state.schema_version, state.store, state.waiter, state.submitter)
