"""What the sync and the async sharded client share: the map, one client per shard,
which shard a request goes to (refusing one that would span shards), and the
once-per-shard check of its id range. Each client adds only how its calls run."""

from __future__ import annotations

import os
import threading
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

    @staticmethod
    def _unavailable(shard: Shard, exc: DatabaseUnavailable) -> ShardUnavailable:
        """The outage, named by its shard (already named: as it is)."""
        if isinstance(exc, ShardUnavailable):
            return exc
        return ShardUnavailable(f"{shard} is unavailable: {exc}")
