"""A real Worker, in this process, against a real database.

The worker runs its own event loop on a thread (as it would in its own process);
the test thread enqueues with the Client, waits on database conditions with
deadlines, and stops the worker the way a signal would (``request_stop`` on the
worker's loop). Timings are short (lease 2 s, heartbeat 0.5 s) so the cancel and
timeout paths finish in a few seconds.
"""

from __future__ import annotations

import asyncio
import math
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
from psycopg.rows import DictRow

from deadman.client import Client
from deadman.config import Settings
from deadman.db.queries import QUERIES
from deadman.model import Backoff, Job
from deadman.registry import Registry
from deadman.worker.context import JobContext
from deadman.worker.process import Worker
from deadman.worker.worker_store import WorkerStore
from tests.factories import attempt_rows, connect, job_row
from tests.helpers import wait_for

SETTINGS = Settings(
    lease_ttl_s=2.0,
    heartbeat_s=0.5,
    rescue_s=0.3,
    poll_s=0.5,
    concurrency=4,
    shutdown_grace_s=0.0,
    max_attempts=3,
)
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


@pytest.fixture
def client(db_dsn: str) -> Iterator[Client]:
    with Client(db_dsn, settings=SETTINGS) as c:
        c.get(0)  # build the pool on this thread before anything else uses it
        yield c


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


# ----------------------------------------------------------------------------- tests


def test_handlers_of_every_kind(db_dsn: str, client: Client) -> None:
    jobs = {
        "async": client.enqueue("t.async", {"x": 1}).id,
        "sync": client.enqueue("t.sync").id,
        "effect-async": client.enqueue("t.effect-async").id,
        "effect-sync": client.enqueue("t.effect-sync").id,
        "raise": client.enqueue("t.raise", max_attempts=2, backoff=FAST_RETRY).id,
        "not-json": client.enqueue("t.not-json", max_attempts=1).id,
        "builtin": client.enqueue("noop").id,
        "unknown": client.enqueue("t.nobody-handles-this", max_attempts=1).id,
    }
    with connect(db_dsn) as conn, running_worker(db_dsn) as worker:
        wait_terminal(conn, list(jobs.values()), timeout=8)
        assert worker.stop() == 0
        rows = {k: job_row(conn, v) for k, v in jobs.items()}
        history = {k: [a["outcome"] for a in attempt_rows(conn, v)] for k, v in jobs.items()}

        assert rows["async"]["state"] == "succeeded"
        assert rows["async"]["result"] == {"echo": {"x": 1}, "attempt": 1}
        assert rows["sync"]["result"] == {"thread": True}
        for kind in ("effect-async", "effect-sync"):
            assert rows[kind]["state"] == "succeeded"
            assert effects(conn, jobs[kind]) == 1
            assert history[kind] == ["succeeded"]
        assert rows["effect-async"]["result"] == {"effect": "async"}
        assert rows["effect-sync"]["result"] == {"effect": "sync"}

        assert rows["raise"]["state"] == "dead"
        assert history["raise"] == ["failed", "failed"]
        assert "ValueError: boom on attempt 2" in rows["raise"]["last_error"]

        assert rows["not-json"]["state"] == "dead"
        assert "handler result is not JSON" in rows["not-json"]["last_error"]
        assert history["not-json"] == ["failed"]

        assert rows["builtin"]["state"] == "succeeded"
        assert rows["unknown"]["state"] == "dead"
        assert "no handler registered" in rows["unknown"]["last_error"]

        for kind, job_id in jobs.items():
            attempts = attempt_rows(conn, job_id)
            assert [a["attempt"] for a in attempts] == list(range(1, len(attempts) + 1)), kind
            assert {a["worker"] for a in attempts} == {worker.worker_id}, kind
        leftovers = conn.execute(
            "SELECT count(*) AS n FROM deadman.workers WHERE id = %s", (worker.worker_id,)
        ).fetchone()
        assert leftovers == {"n": 0}  # deregistered on the way out


def test_retries_wait_for_their_backoff(db_dsn: str, client: Client) -> None:
    job_id = client.enqueue("t.flaky", max_attempts=3, backoff=FAST_RETRY).id
    with connect(db_dsn) as conn, running_worker(db_dsn) as worker:
        # The job sits in 'retrying' for at least 400 ms, then 800 ms, between attempts.
        wait_for(lambda: state_of(conn, job_id) == "retrying", timeout=5, message="retrying")
        wait_terminal(conn, [job_id], timeout=8)
        assert worker.stop() == 0
        row = job_row(conn, job_id)
        attempts = attempt_rows(conn, job_id)
    assert row["state"] == "succeeded" and row["result"] == {"succeeded_on": 3}
    assert [a["outcome"] for a in attempts] == ["failed", "failed", "succeeded"]
    # Next attempt started no earlier than the backoff after the failure (same DB clock).
    gap1 = (attempts[1]["started_at"] - attempts[0]["finished_at"]).total_seconds()
    gap2 = (attempts[2]["started_at"] - attempts[1]["finished_at"]).total_seconds()
    assert gap1 >= FAST_RETRY.ceiling_ms(1) / 1000
    assert gap2 >= FAST_RETRY.ceiling_ms(2) / 1000


def test_a_failed_transaction_rolls_its_effect_back(db_dsn: str, client: Client) -> None:
    job_id = client.enqueue("t.effect-then-raise", max_attempts=2, backoff=FAST_RETRY).id
    with connect(db_dsn) as conn, running_worker(db_dsn) as worker:
        wait_terminal(conn, [job_id], timeout=8)
        assert worker.stop() == 0
        assert state_of(conn, job_id) == "dead"
        assert effects(conn, job_id) == 0
        assert [a["outcome"] for a in attempt_rows(conn, job_id)] == ["failed", "failed"]


def test_a_cancel_request_stops_a_running_job(db_dsn: str, client: Client) -> None:
    job_id = client.enqueue("sleep", {"ms": 30_000}).id
    with connect(db_dsn) as conn, running_worker(db_dsn) as worker:
        wait_for(lambda: state_of(conn, job_id) == "running", timeout=5, message="running")
        conn.execute("UPDATE deadman.jobs SET cancel_requested = true WHERE id = %s", (job_id,))
        # a few heartbeats (0.5 s each), nowhere near the 30 s sleep
        wait_for(lambda: state_of(conn, job_id) == "cancelled", timeout=5, message="cancelled")
        assert worker.stop() == 0
        row = job_row(conn, job_id)
        assert row["finished_at"] is not None and row["last_error"] == "cancelled on request"
        assert [a["outcome"] for a in attempt_rows(conn, job_id)] == ["cancelled"]


def test_a_timeout_ends_the_attempt(db_dsn: str, client: Client) -> None:
    job_id = client.enqueue("sleep", {"ms": 30_000}, timeout=0.3, max_attempts=1).id
    with connect(db_dsn) as conn, running_worker(db_dsn) as worker:
        wait_terminal(conn, [job_id], timeout=5)
        assert worker.stop() == 0
        row = job_row(conn, job_id)
        assert row["state"] == "dead"
        assert row["last_error"] == "timed out after 300 ms"
        assert [a["outcome"] for a in attempt_rows(conn, job_id)] == ["timed_out"]


def test_a_job_still_running_at_shutdown_is_released(db_dsn: str, client: Client) -> None:
    job_id = client.enqueue("sleep", {"ms": 30_000}).id
    with connect(db_dsn) as conn, running_worker(db_dsn) as worker:
        wait_for(lambda: state_of(conn, job_id) == "running", timeout=5, message="running")
        assert worker.stop() == 0  # grace 0: released at once
        row = job_row(conn, job_id)
        assert (row["state"], row["attempt"], row["lease_token"]) == ("queued", 0, None)
        assert [a["outcome"] for a in attempt_rows(conn, job_id)] == ["released"]


def test_start_and_stop_three_times(db_dsn: str, client: Client) -> None:
    with connect(db_dsn) as conn:
        seen_workers: set[str] = set()
        for round_ in range(3):
            job_id = client.enqueue("t.async", {"round": round_}).id
            with running_worker(db_dsn) as worker:
                wait_terminal(conn, [job_id], timeout=5)
                assert worker.stop() == 0
                seen_workers.add(worker.worker_id)
            assert state_of(conn, job_id) == "succeeded"
            assert conn.execute("SELECT count(*) AS n FROM deadman.workers").fetchone() == {"n": 0}
            running = conn.execute(
                "SELECT count(*) AS n FROM deadman.jobs WHERE state = 'running'"
            ).fetchone()
            assert running == {"n": 0}
        assert len(seen_workers) == 3


def test_a_nan_result_fails_the_attempt_and_the_worker_survives(
    db_dsn: str, client: Client
) -> None:
    bad = client.enqueue("t.nan", max_attempts=1).id
    with connect(db_dsn) as conn, running_worker(db_dsn) as worker:
        try:
            wait_terminal(conn, [bad], timeout=4)
        finally:
            code = worker.stop(timeout=30)
        assert state_of(conn, bad) == "dead"
        assert code == 0
