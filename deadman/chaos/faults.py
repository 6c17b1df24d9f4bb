"""The fault schedule, reproducible from ``--seed``.

Every decision is drawn from a random generator seeded with ``(seed, tick)``, so
tick 17 of seed 1 kills the same worker slots on every run, however long the
earlier ticks took. What a seed cannot pin down is *where in the load* a tick lands
(that depends on the machine's speed); the report therefore lists every fault that
was actually applied, with its time.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field
from typing import Any

#: The one-off episodes, in the order they run (one at a time, while kills go on).
#: Those that need a worker holding leases go first, while the queue is still full;
#: a restart can be judged by heartbeats alone, so it goes last.
EPISODES = ("zombie", "partition", "hosts", "pg-restart-fast", "pg-restart-immediate")


@dataclass(frozen=True)
class Tick:
    """What to do at one kill interval."""

    index: int
    kills: tuple[int, ...]  # worker slots to SIGKILL
    conn_kills: int  # how many worker backends to pg_terminate_backend
    draw: float  # a spare draw for choosing among backends reproducibly


@dataclass(frozen=True)
class FaultPlan:
    seed: int
    workers: int
    kill_rate: float
    kill: bool
    conn_kill: bool

    def _rng(self, *key: object) -> random.Random:
        return random.Random(":".join(str(k) for k in (self.seed, *key)))

    def tick(self, index: int) -> Tick:
        rng = self._rng("tick", index)
        # Always draw, whether or not the scenario is on: switching one scenario on
        # must not change another's schedule.
        kill_draws = [rng.random() for _ in range(self.workers)]
        conn_draw = rng.random()
        conn_n = rng.randint(1, 3)
        draw = rng.random()
        kills = (
            tuple(i for i, d in enumerate(kill_draws) if d < self.kill_rate) if self.kill else ()
        )
        conn = conn_n if self.conn_kill and conn_draw < max(self.kill_rate, 0.5) else 0
        return Tick(index, kills, conn, draw)

    def episode_slot(self, episode: str) -> int:
        """The worker slot an episode (zombie, partition) picks. The two differ when
        there are two workers or more, so that neither is judged by the other's
        late writes."""
        zombie = self._rng("episode", "zombie").randrange(self.workers)
        if episode != "partition" or self.workers == 1:
            return zombie
        step = 1 + self._rng("episode", episode).randrange(self.workers - 1)
        return (zombie + step) % self.workers

    def pick(self, tick: Tick, candidates: list[int], n: int) -> list[int]:
        """Choose n of the candidates (sorted first) reproducibly for this tick."""
        if not candidates or n <= 0:
            return []
        return random.Random(tick.draw).sample(sorted(candidates), min(n, len(candidates)))


@dataclass
class Applied:
    """One fault that was applied: when (seconds since the run began), what, where."""

    at_s: float
    kind: str
    target: str
    detail: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["at_s"] = round(self.at_s, 3)
        return out
