"""What the sync and the async sharded client share: the map, one client per shard,
which shard a request goes to (refusing one that would span shards), and the
once-per-shard check of its id range. Each client adds only how its calls run."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterable
from typing import Any, Generic, TypeVar, Unpack

from deadman.clientcore.options import JobOptions, new_job
from deadman.config import Settings
from deadman.errors import DatabaseUnavailable
from deadman.shards.shardmap import CrossShard, Shard, ShardMap, ShardUnavailable
from deadman.store import NewJob

#: how long a call waits for a connection to a shard before ShardUnavailable: a
#: shard that is down fails its own calls quickly instead of holding the caller
DEFAULT_TIMEOUT_S = 5.0
#: after a call found its shard unavailable, the shard's calls fail at once for this
#: long, then the next one tries again: without it every call for a down shard's
#: queues waits ``timeout`` for its pool (measured: the first calls fail in 1 ms on a
#: broken connection, each later one after exactly ``timeout``). The cost: a shard
#: back within the pause, or one only too busy to lend a connection in ``timeout``,
#: is refused for up to this long.
PAUSE_S = 1.0

C = TypeVar("C")


class Router(Generic[C]):
    """``shards`` defaults to the map in ``DEADMAN_SHARDS``. ``timeout``: how long a
    call waits for a connection to its shard before :class:`ShardUnavailable`.
    Before its first call to a shard the client checks, once, that the shard's
    database hands out that shard's ids (``deadman shards init``)."""

    def __init__(
        self,
        shards: ShardMap | None = None,
        *,
        settings: Settings | None = None,
        timeout: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        self.map = shards or ShardMap.from_env(os.environ)
        self._timeout = timeout
        settings = settings or Settings.from_env()
        self._clients = {s.name: self._client_of(s, settings) for s in self.map.shards}
        self._checked: set[str] = set()
        self._resting: dict[str, float] = {}  # shard -> when its calls may try again
        self._lock = threading.Lock()  # never held across an await

    def _client_of(self, shard: Shard, settings: Settings) -> C:
        """A new client of the shard's database (sync or async: the subclass's)."""
        raise NotImplementedError  # pragma: no cover

    def client_for(self, shard: Shard) -> C:
        """The shard's own client, for any call not routed here (schedules, ...)."""
        return self._clients[shard.name]

    def job(self, type: str, payload: Any = None, **options: Unpack[JobOptions]) -> NewJob:
        """As :meth:`deadman.Client.job`: build and check a job without sending it."""
        return new_job(type, payload, options)

    def by_shard(self, jobs: Iterable[NewJob]) -> dict[Shard, list[NewJob]]:
        """``jobs`` grouped by the shard of their queue, each group in the given order."""
        groups: dict[Shard, list[NewJob]] = {}
        for new in jobs:
            groups.setdefault(self.map.for_queue(new.queue), []).append(new)
        return groups

    def _shard_of_jobs(self, jobs: list[NewJob], what: str = "batch") -> Shard:
        """The one shard of every job's queue and dependency; CrossShard if not one."""
        shards = {new.queue: self.map.for_queue(new.queue) for new in jobs}
        if len(set(shards.values())) > 1:
            spread = ", ".join(f"{q} -> {s.name}" for q, s in sorted(shards.items()))
            raise CrossShard(f"{what} spans shards ({spread}); it must stay within one")
        (shard,) = set(shards.values())
        for new in jobs:
            for dep in new.depends_on:
                if self.map.for_id(dep) != shard:
                    raise CrossShard(
                        f"job in queue {new.queue!r} (shard {shard.name}) cannot depend on "
                        f"job {dep} of shard {self.map.for_id(dep).name}"
                    )
        return shard

    def _is_checked(self, shard: Shard) -> bool:
        with self._lock:
            return shard.name in self._checked

    def _checked_now(self, shard: Shard) -> None:
        with self._lock:
            self._checked.add(shard.name)

    def _refuse_if_resting(self, shard: Shard) -> bool:
        """ShardUnavailable at once while the shard rests after a failure (PAUSE_S);
        True for the first call after a rest: its pool may still hold connections
        the outage broke, which the caller has checked (and dropped) before use."""
        with self._lock:
            until = self._resting.get(shard.name)
            left = 0.0 if until is None else until - time.monotonic()
            if until is not None and left <= 0:
                del self._resting[shard.name]
        if left > 0:
            raise ShardUnavailable(
                f"{shard} is unavailable (it failed less than {PAUSE_S:g} s ago; "
                f"next try in {left:.2f} s)"
            )
        return until is not None

    def _unavailable(self, shard: Shard, exc: DatabaseUnavailable) -> ShardUnavailable:
        """The outage, named by its shard; the shard rests for PAUSE_S."""
        with self._lock:
            self._resting[shard.name] = time.monotonic() + PAUSE_S
        if isinstance(exc, ShardUnavailable):
            return exc
        return ShardUnavailable(f"{shard} is unavailable: {exc}")
