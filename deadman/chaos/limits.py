"""The ``limits`` scenario: the limits set before the load starts, and the key each
submitted job carries (a seeded share of them; the rest none).

Four keys have a limit (two concurrency-only, one rate-only, one both) and one key
has none, so the report shows beside the limited keys what the same load does to a
key nothing holds back. Keyed jobs are ordinary chaos jobs otherwise: the
exactly-once checks of ``verify.sql`` judge them with the rest; ``verify_limits``
adds what the attempt history says about each key.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

#: The share of the submitted jobs that carry a key (the rest carry none).
KEYED_SHARE = 0.2


@dataclass(frozen=True)
class KeyLimit:
    """A key and the limit the harness sets on it (None, None: no limit row at all)."""

    key: str
    concurrency: int | None = None
    rate: tuple[int, int] | None = None  # (count, per_ms)

    @property
    def limited(self) -> bool:
        return self.concurrency is not None or self.rate is not None

    def body(self) -> dict[str, Any]:
        """``PUT /limits/{key}``'s body."""
        rate = None if self.rate is None else {"count": self.rate[0], "per_ms": self.rate[1]}
        return {"concurrency": self.concurrency, "rate": rate}

    def client_rate(self) -> tuple[int, timedelta] | None:
        """``Client.set_limit``'s ``rate``."""
        return None if self.rate is None else (self.rate[0], timedelta(milliseconds=self.rate[1]))


#: Small concurrencies so that a fleet of 4 x 32 slots presses on them all the time;
#: rates whose windows slide many times in a run. The last key has no limit row.
KEYS = (
    KeyLimit("chaos-c3", concurrency=3),
    KeyLimit("chaos-c8", concurrency=8),
    KeyLimit("chaos-r50", rate=(50, 1000)),
    KeyLimit("chaos-c5-r20", concurrency=5, rate=(20, 500)),
    KeyLimit("chaos-free"),
)


def limited() -> list[KeyLimit]:
    """The keys the harness sets a limit on before the load."""
    return [k for k in KEYS if k.limited]


class KeyDraw:
    """The limit key of each job, in submission order, from the run's seed; None for
    every job when the scenario is off. A random stream of its own, so that turning
    the scenario on or off moves no other draw (payloads, submission faults)."""

    def __init__(self, seed: int, enabled: bool) -> None:
        self._rng = random.Random(f"{seed}:limits")
        self._enabled = enabled

    def __call__(self) -> str | None:
        if not self._enabled or self._rng.random() >= KEYED_SHARE:
            return None
        return self._rng.choice(KEYS).key
