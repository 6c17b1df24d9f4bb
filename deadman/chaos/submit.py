"""``--submit client``: the jobs go in through the Python client's COPY path.

Also the job settings both submission paths share.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg

from deadman.chaos.limits import KeyDraw, KeyLimit
from deadman.client import Client
from deadman.errors import DeadmanError
from deadman.model import Backoff

SUBMIT_BATCH = 5000
#: Failed attempts (a killed connection mid-handler, Postgres restarting) are retried
#: soon and often: the run is about effects, not about retry policy.
JOB_MAX_ATTEMPTS = 25
JOB_BACKOFF = Backoff(strategy="exponential", base_ms=100, max_ms=2000)


@dataclass(frozen=True)
class SubmitRun:
    """What either submitter is asked to do: how many jobs, from which seed, with
    which handler delay, until ``stop`` is set or the deadline (monotonic) passes;
    ``limits``: a share of the jobs carry a limit key (the ``limits`` scenario)."""

    jobs: int
    seed: int
    handler_ms: int
    stop: threading.Event
    deadline: float
    limits: bool


class SubmitterBase(threading.Thread):
    """What the harness reads from either submitter: progress (in all and by limit
    key), resends, the outcome."""

    def __init__(self, name: str, run: SubmitRun) -> None:
        super().__init__(name=name, daemon=True)
        self.jobs = run.jobs
        self.seed = run.seed
        self.handler_ms = run.handler_ms
        self.stop = run.stop
        self.deadline = run.deadline
        self.prefix = f"chaos-{run.seed}-"  # idempotency keys: <prefix><n>
        self.acked = 0
        #: acknowledged jobs by limit key (the limits scenario)
        self.keyed: dict[str, int] = {}
        self.key_of = KeyDraw(run.seed, run.limits)
        self.resends = 0
        self.error: str | None = None
        self.finished = threading.Event()
        self.duration_s = 0.0

    def _acknowledged(self, keys: Sequence[str | None]) -> None:
        """A batch of jobs with these limit keys was acknowledged."""
        self.acked += len(keys)
        for key in keys:
            if key is not None:
                self.keyed[key] = self.keyed.get(key, 0) + 1


class Submitter(SubmitterBase):
    """Enqueues every job through the Python client, in COPY batches, as fast as the
    database takes them (which is much faster than the fleet runs them). A batch is
    acknowledged when its COMMIT returned; a batch that fails (Postgres restarting) is
    sent again, and the idempotency keys make the resend harmless."""

    def __init__(self, dsn: str, run: SubmitRun) -> None:
        super().__init__("chaos-submitter", run)
        self.dsn = dsn

    def set_limits(self, limits: Sequence[KeyLimit]) -> None:
        """Set each limit through the Python client (before any job is submitted)."""
        with Client(self.dsn) as client:
            for lim in limits:
                client.set_limit(lim.key, concurrency=lim.concurrency, rate=lim.client_rate())

    def run(self) -> None:
        started = time.monotonic()
        rng = random.Random(f"{self.seed}:payload")
        try:
            with Client(self.dsn) as client:
                for first in range(0, self.jobs, SUBMIT_BATCH):
                    numbers = range(first, min(first + SUBMIT_BATCH, self.jobs))
                    keys = [self.key_of() for _ in numbers]
                    batch = [
                        client.job(
                            "chaos-effect",
                            {"ms": rng.randint(0, self.handler_ms)},
                            max_attempts=JOB_MAX_ATTEMPTS,
                            backoff=JOB_BACKOFF,
                            idempotency_key=f"{self.prefix}{n}",
                            limit_key=key,
                        )
                        for n, key in zip(numbers, keys, strict=True)
                    ]
                    self._send(client, batch)
                    self._acknowledged(keys)
        except _GaveUp as exc:
            self.error = str(exc)
        finally:
            self.duration_s = time.monotonic() - started
            self.finished.set()

    def _send(self, client: Client, batch: list[Any]) -> None:
        delay = 0.1
        while True:
            try:
                client.enqueue_many(batch)
                return
            except (DeadmanError, psycopg.Error) as exc:
                if self.stop.is_set() or time.monotonic() > self.deadline:
                    raise _GaveUp(f"submission stopped: {exc}") from exc
                self.resends += 1
                time.sleep(delay)
                delay = min(delay * 2, 2.0)


class _GaveUp(Exception):
    pass
