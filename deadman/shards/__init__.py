"""Queues across several Postgres clusters, each a full Deadman schema: the shard map
(``DEADMAN_SHARDS``, :mod:`.shardmap`), ids that name their shard (:mod:`.ids`) and
the clients that route by queue and by id (:mod:`.client`, :mod:`.aclient`, sharing
:mod:`.routing`)."""

from __future__ import annotations

from deadman.shards.aclient import AsyncShardedClient
from deadman.shards.client import ShardedClient
from deadman.shards.ids import id_range, shard_index_of
from deadman.shards.shardmap import (
    CrossShard,
    Shard,
    ShardError,
    ShardMap,
    ShardUnavailable,
    UnknownShard,
    UnroutedQueue,
)

__all__ = [
    "AsyncShardedClient",
    "CrossShard",
    "Shard",
    "ShardError",
    "ShardMap",
    "ShardUnavailable",
    "ShardedClient",
    "UnknownShard",
    "UnroutedQueue",
    "id_range",
    "shard_index_of",
]
