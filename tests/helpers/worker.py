"""A real Worker, in this process, for the integration tests.

The worker runs its own event loop on a thread (as it would in its own process);
the test thread enqueues with the Client, waits on database conditions with
deadlines, and stops the worker the way a signal would (``request_stop`` on the
worker's loop). ``registry`` holds the test handlers (``t.*``), the default of
``running_worker``; test modules may register more on it.
"""

from __future__ import annotations

import asyncio
import math
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import psycopg
from psycopg.rows import DictRow

from deadman.config import Settings
from deadman.db.queries import QUERIES
from deadman.model import Backoff, Job
from deadman.registry import Registry
from deadman.worker.context import JobContext
from deadman.worker.process import Worker
from deadman.worker.worker_store import WorkerStore
from tests.factories import job_row
from tests.helpers import wait_for

#: The worker's timings for every test whose lease must hold: a 10 s lease the worker
#: trusts for 9.5 s after each renewal, so a stall of the loaded test machine (1.5 s is
#: seen on 2 shared cores) cannot lose it, rescue the job and add an attempt the test
#: did not expect. A 0.5 s heartbeat and 0.3 s rescuer keep cancels and rescues of
#: backdated leases quick.
SETTINGS = Settings(
    lease_ttl_s=10.0,
    heartbeat_s=0.5,
    rescue_s=0.3,
    poll_s=0.5,
    concurrency=4,
    shutdown_grace_s=0.0,
    max_attempts=3,
)
#: For the tests that need a lease to lapse: trusted for 1.5 s after a renewal,
#: rescued within a few tenths of a second after it lapses.
EXPIRING = replace(SETTINGS, lease_ttl_s=2.0)
FAST_RETRY = Backoff(strategy="exponential", base_ms=400, max_ms=5000, jitter="none")

registry = Registry()


@registry.handler("t.async")
async def async_handler(job: Job, ctx: JobContext) -> dict[str, Any]:
    await asyncio.sleep(0)
    return {"echo": job.payload, "attempt": ctx.attempt}


@registry.handler("t.sync")
def sync_handler(job: Job, ctx: JobContext) -> dict[str, Any]:
    return {"thread": threading.current_thread().name.startswith("handler")}


@registry.handler("t.effect-async")
async def effect_async(job: Job, ctx: JobContext) -> None:
    async with ctx.transaction() as conn:
        await conn.execute(
            QUERIES["effect_insert"], {"job_id": job.id, "lease_token": ctx.lease_token}
        )
        ctx.result = {"effect": "async"}


@registry.handler("t.effect-sync")
def effect_sync(job: Job, ctx: JobContext) -> None:
    with ctx.transaction() as conn:
        conn.execute(QUERIES["effect_insert"], {"job_id": job.id, "lease_token": ctx.lease_token})
        ctx.result = {"effect": "sync"}


@registry.handler("t.effect-then-raise")
async def effect_then_raise(job: Job, ctx: JobContext) -> None:
    # The effect is written, then the handler fails inside the transaction: the effect
    # must roll back with it, every attempt.
    async with ctx.transaction() as conn:
        await conn.execute(
            QUERIES["effect_insert"], {"job_id": job.id, "lease_token": ctx.lease_token}
        )
        raise RuntimeError("failed after writing the effect")


@registry.handler("t.raise")
async def raising(job: Job, ctx: JobContext) -> None:
    raise ValueError(f"boom on attempt {ctx.attempt}")


@registry.handler("t.flaky")
async def flaky(job: Job, ctx: JobContext) -> dict[str, int]:
    if ctx.attempt < 3:
        raise RuntimeError(f"flaky failure {ctx.attempt}")
    return {"succeeded_on": ctx.attempt}


@registry.handler("t.not-json")
async def not_json(job: Job, ctx: JobContext) -> object:
    return {1, 2, 3}


@registry.handler("t.nan")
async def nan_result(job: Job, ctx: JobContext) -> float:
    return math.nan


class WorkerThread:
    """One Worker on its own event loop in a thread; ``stop()`` returns run()'s code."""

    def __init__(
        self,
        dsn: str,
        settings: Settings,
        handlers: Registry | None = None,
        store: WorkerStore | None = None,
    ) -> None:
        self._dsn = dsn
        self._store = store
        self._settings = settings
        self._handlers = registry if handlers is None else handlers
        self._loop: asyncio.AbstractEventLoop | None = None
        self._worker: Worker | None = None
        self._ready = threading.Event()
        self.code: int | None = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="worker-loop", daemon=True)

    def _main(self) -> None:
        async def main() -> int:
            self._worker = Worker(self._dsn, self._settings, self._handlers, store=self._store)
            self._loop = asyncio.get_running_loop()
            self._ready.set()
            return await self._worker.run()

        try:
            self.code = asyncio.run(main())
        except BaseException as exc:
            self.error = exc
        finally:
            self._ready.set()

    @property
    def worker_id(self) -> str:
        assert self._worker is not None
        return self._worker.worker_id

    def start(self) -> None:
        self._thread.start()
        assert self._ready.wait(timeout=10), "the worker's loop did not start"

    def stop(self, timeout: float = 15.0) -> int:
        """Ask once (a second request_stop is a hard os._exit), wait, return the code."""
        if self._thread.is_alive() and self._loop is not None and self._worker is not None:
            self._loop.call_soon_threadsafe(self._worker.request_stop)
        self._thread.join(timeout=timeout)
        assert not self._thread.is_alive(), "the worker did not stop in time"
        if self.error is not None:
            raise self.error
        assert self.code is not None
        return self.code

    @property
    def claims(self) -> int:
        """Claim statements the worker's producer has sent so far."""
        assert self._worker is not None
        producer = self._worker.producer
        return 0 if producer is None else producer.claims

    @property
    def handed(self) -> int:
        """Jobs enqueues handed to the worker's parked slots, adopted so far."""
        assert self._worker is not None
        producer = self._worker.producer
        return 0 if producer is None else producer.parking.adopted

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()


@contextmanager
def running_worker(
    dsn: str,
    settings: Settings = SETTINGS,
    handlers: Registry | None = None,
    store: WorkerStore | None = None,
) -> Iterator[WorkerThread]:
    """A started WorkerThread (``handlers``: this module's registry unless given;
    ``store``: the worker's own AsyncStore unless given)."""
    w = WorkerThread(dsn, settings, handlers, store)
    w.start()
    try:
        yield w
    finally:
        if w.alive:
            w.stop()


def state_of(conn: psycopg.Connection[DictRow], job_id: int) -> str:
    return str(job_row(conn, job_id)["state"])


def wait_terminal(conn: psycopg.Connection[DictRow], ids: list[int], timeout: float) -> None:
    terminal = {"succeeded", "dead", "cancelled"}
    wait_for(
        lambda: all(state_of(conn, i) in terminal for i in ids),
        timeout=timeout,
        message=f"jobs {ids} to finish",
    )


def effects(conn: psycopg.Connection[DictRow], job_id: int) -> int:
    row = conn.execute(QUERIES["effect_count"], {"job_id": job_id}).fetchone()
    assert row is not None
    return int(row["n"])
