"""The shard map: which Postgres cluster (each a full Deadman schema) holds which
queue, read from ``DEADMAN_SHARDS``, and which shard a job id belongs to.

``DEADMAN_SHARDS`` is JSON, because a DSN may hold any of ``;,=`` (a password, a
``options=-c x=y``) and JSON quotes it unambiguously::

    {"a": {"index": 1, "url": "postgresql://db-a/deadman", "queues": ["default", "mail"]},
     "b": {"index": 2, "url": "postgresql://db-b/deadman", "queues": ["payments", "*"]}}

Each shard: a name (the key: 1-40 of ``[a-z0-9_-]``), its ``index`` (0-31, unique;
it is written into every id the shard hands out, see :mod:`deadman.shards.ids`, so it
never changes once jobs exist), its ``url`` and the ``queues`` it holds. ``"*"`` in one
shard's queues makes it the fallback for every queue no shard names; without it an
unnamed queue is refused (:class:`UnroutedQueue`). A queue named by two shards is
refused when the map is read: it would split one queue's jobs, its pause and its
ordering across two clusters.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from deadman.errors import ConfigError, DatabaseUnavailable, DeadmanError
from deadman.shards.ids import MAX_INDEX, shard_index_of
from deadman.spec import SpecError, validate
from deadman.spec.job import JobSpec

ENV = "DEADMAN_SHARDS"
FALLBACK = "*"
_SHARD_NAME = re.compile(r"[a-z0-9_-]{1,40}")
_FIELDS = {"index", "url", "queues"}


class ShardError(DeadmanError):
    """A request the shard map cannot route: see the children."""


class UnroutedQueue(ShardError):
    """No shard holds the queue and the map has no ``"*"`` fallback."""


class CrossShard(ShardError):
    """One request would touch two shards (a workflow whose nodes are in queues of
    different shards, a batch across shards, a dependency on another shard's job):
    workflows, batches, dependencies and limits live within one shard."""


class UnknownShard(ShardError):
    """A job or workflow id whose shard index is in no shard of the map."""


class ShardUnavailable(DatabaseUnavailable):
    """The shard's cluster could not be reached; the other shards are unaffected.
    A DatabaseUnavailable, so callers (and HTTP: 503) treat it as transient."""


@dataclass(frozen=True)
class Shard:
    name: str
    index: int
    url: str
    queues: tuple[str, ...]

    def __str__(self) -> str:
        return f"shard {self.name} (index {self.index}, queues {', '.join(self.queues)})"


@dataclass(frozen=True)
class ShardMap:
    """The shards, by name; routing by queue (:meth:`for_queue`) and by id
    (:meth:`for_id`)."""

    shards: tuple[Shard, ...]

    @classmethod
    def parse(cls, text: str) -> ShardMap:
        """The map ``text`` (``DEADMAN_SHARDS``'s JSON) describes; ConfigError naming
        the variable and what is wrong with it, never a partial map."""
        try:
            raw = json.loads(text)
        except (ValueError, RecursionError) as exc:
            raise _bad(f"is not JSON ({exc})") from None
        if not isinstance(raw, dict) or not raw:
            raise _bad('must be a JSON object of shards: {"name": {"index", "url", "queues"}}')
        return cls(tuple(_shard(name, spec) for name, spec in raw.items())).checked()

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> ShardMap:
        text = environ.get(ENV)
        if not text:
            raise ConfigError(f"{ENV} is not set")
        return cls.parse(text)

    def checked(self) -> ShardMap:
        """This map, once no index, url or queue is held twice."""
        seen: dict[tuple[str, object], str] = {}
        seen_queue: dict[str, str] = {}
        for shard in self.shards:
            for what, value in (("index", shard.index), ("url", shard.url)):
                if (what, value) in seen:
                    other = seen[what, value]
                    raise _bad(f"shards {other} and {shard.name} have the same {what}")
                seen[what, value] = shard.name
            for queue in shard.queues:
                if queue in seen_queue:
                    other = seen_queue[queue]
                    what = "the fallback '*'" if queue == FALLBACK else f"queue {queue!r}"
                    raise _bad(f"{what} is in two shards: {other} and {shard.name}")
                seen_queue[queue] = shard.name
        return self

    def named(self, name: str) -> Shard:
        for shard in self.shards:
            if shard.name == name:
                return shard
        raise UnknownShard(f"no shard {name!r} in {ENV}")

    def for_queue(self, queue: str) -> Shard:
        """The shard holding ``queue``: the one naming it, else the fallback."""
        fallback = None
        for shard in self.shards:
            if queue in shard.queues:
                return shard
            if FALLBACK in shard.queues:
                fallback = shard
        if fallback is None:
            raise UnroutedQueue(f"no shard holds queue {queue!r} and {ENV} has no '*' fallback")
        return fallback

    def for_id(self, job_id: int) -> Shard:
        """The shard a job (or workflow) id came from: its index is the id's top bits."""
        index = shard_index_of(job_id)
        for shard in self.shards:
            if shard.index == index:
                return shard
        raise UnknownShard(f"id {job_id} is from shard index {index}, which is in no shard")


def _shard(name: object, spec: Any) -> Shard:
    if not isinstance(name, str) or not _SHARD_NAME.fullmatch(name):
        raise _bad(f"shard name {name!r} is not 1-40 of [a-z0-9_-]")
    if not isinstance(spec, dict):
        raise _bad(f"shard {name}: must be an object with index, url and queues")
    missing, unknown = _FIELDS - spec.keys(), spec.keys() - _FIELDS
    if missing or unknown:
        parts = [f"missing {', '.join(sorted(missing))}"] if missing else []
        parts += [f"unknown {', '.join(sorted(unknown))}"] if unknown else []
        raise _bad(f"shard {name}: {'; '.join(parts)}")
    index, url, queues = spec["index"], spec["url"], spec["queues"]
    if type(index) is not int or not 0 <= index <= MAX_INDEX:
        raise _bad(f"shard {name}: index must be an integer from 0 to {MAX_INDEX}")
    if not isinstance(url, str) or not url.strip():
        raise _bad(f"shard {name}: url must be a non-empty string")
    if not isinstance(queues, list) or not queues:
        raise _bad(f"shard {name}: queues must be a non-empty list of queue names")
    for queue in queues:
        if queue != FALLBACK and not _is_queue_name(queue):
            raise _bad(f"shard {name}: {queue!r} is not a queue name (nor '*')")
    if len(set(queues)) != len(queues):
        raise _bad(f"shard {name}: a queue is listed twice")
    return Shard(name, index, url, tuple(queues))


def _is_queue_name(value: object) -> bool:
    """The rule ``POST /jobs`` checks ``queue`` with (deadman.spec)."""
    if not isinstance(value, str):
        return False
    try:
        validate(JobSpec, {"type": "x", "queue": value})
    except SpecError:
        return False
    return True


def _bad(what: str) -> ConfigError:
    return ConfigError(f"{ENV} {what}")
