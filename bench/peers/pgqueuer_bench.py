"""pgqueuer under the same benchmarks, through its own documented API.

- Bulk enqueue: ``Queries.enqueue`` with lists (one UNNEST insert), its batch path.
- Workers: ``QueueManager.run(batch_size=B)`` over one asyncpg connection, as in
  pgqueuer's README; no concurrency limit (``max_concurrent_tasks`` None, the
  entrypoint's ``concurrency_limit`` 0), or the entrypoint's ``concurrency_limit=N``
  for the concurrency-N shapes; with no options at all for the defaults shape.
- Tables installed with the default durability (``durable``: all tables logged).
- Verification: the queue table is empty and ``pgqueuer_log`` holds exactly one
  'successful' row per enqueued job id (pgqueuer deletes a finished job and logs it).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import inspect
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import asyncpg
import psycopg
from pgqueuer.db import AsyncpgDriver
from pgqueuer.models import Job
from pgqueuer.qm import QueueManager
from pgqueuer.queries import Queries

from bench.common import (
    EFFECTS_DDL,
    IO_LABELS,
    IO_WAITS_MS,
    PY,
    Send,
    clean_dir,
    cpu_per_job_us,
    cpu_snapshot,
    cpu_used,
    effects_once,
    io_handler,
    io_name,
    latency_summary,
    mark_ready,
    open_loop,
    read_marks,
    record,
    spawn,
    stop,
    wait_for,
    wait_ready_files,
)

NAME = "pgqueuer"
#: The sync shapes' entrypoint: pgqueuer refuses a sync entrypoint and says to wrap
#: blocking code in ``asyncio.to_thread`` (its EntrypointExecutor's error), so this does.
SYNC_ENTRYPOINT = "noop_sync"
#: The effect shapes' entrypoint: one row into ``bench_effects`` per job, one INSERT
#: committed on its own, on a connection of an asyncpg pool of EFFECT_POOL (the size
#: of Deadman's handler pool at these concurrencies), as a pgqueuer user writes to
#: the database from a job; at least once (the queue's completion is another commit).
EFFECT_ENTRYPOINT = "effect"
EFFECT_POOL = 16
#: what a burn-down's setting says about its entrypoint
ENTRYPOINT_LABELS = {
    "noop": "",
    SYNC_ENTRYPOINT: ", asyncio.to_thread",
    EFFECT_ENTRYPOINT: f", one INSERT on a pool of {EFFECT_POOL}",
    **IO_LABELS,
}


def _default(fn: Any, name: str) -> Any:
    return inspect.signature(fn).parameters[name].default


# pgqueuer's own defaults, read from the installed version (not assumed): run()'s
# batch_size, and an entrypoint's concurrency_limit (0: unlimited).
DEFAULT_BATCH: int = _default(QueueManager.run, "batch_size")
DEFAULT_LIMIT: int = _default(QueueManager.entrypoint, "concurrency_limit")


def setup(dsn: str) -> None:
    async def main() -> None:
        conn = await asyncpg.connect(dsn)
        try:
            await Queries(AsyncpgDriver(conn)).install()
            await conn.execute(EFFECTS_DDL)
        finally:
            await conn.close()

    asyncio.run(main())


def truncate(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "TRUNCATE pgqueuer, pgqueuer_log, pgqueuer_statistics, bench_effects RESTART IDENTITY"
        )
        conn.execute("VACUUM ANALYZE pgqueuer")


def _count(dsn: str, query: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(query).fetchone()
    return int(row[0]) if row else 0


def bulk_enqueue(dsn: str, n: int, per_call: int | None = None, keyed: bool = False) -> float:
    """Seconds for ``Queries.enqueue`` of n jobs, in one call or in calls of
    ``per_call`` jobs one after another (all of them timed); ``keyed``: each job with a
    ``dedupe_key`` of its own, new to the table, duplicates skipped
    (``on_conflict="skip"``: pgqueuer's closest to an idempotency key)."""
    truncate(dsn)
    size = per_call or n

    async def main() -> float:
        conn = await asyncpg.connect(dsn)
        try:
            queries = Queries(AsyncpgDriver(conn))
            ids: list[Any] = []
            t0 = time.perf_counter()
            for start in range(0, n, size):
                k = min(size, n - start)
                if keyed:
                    keys: list[str | None] = [f"bulk-{i}" for i in range(start, start + k)]
                    made = await queries.enqueue(
                        ["noop"] * k, [None] * k, [0] * k, dedupe_key=keys, on_conflict="skip"
                    )
                    ids += [i for i in made if i is not None]
                else:
                    ids += await queries.enqueue(["noop"] * k, [None] * k, [0] * k)
            elapsed = time.perf_counter() - t0
        finally:
            await conn.close()
        if len(ids) != n:
            raise AssertionError(f"pgqueuer stored {len(ids)} of {n}")
        return elapsed

    elapsed = asyncio.run(main())
    if _count(dsn, "SELECT count(*) FROM pgqueuer") != n:
        raise AssertionError("pgqueuer enqueue lost jobs")
    return elapsed


def verify(dsn: str, n: int) -> dict[str, Any]:
    with psycopg.connect(dsn) as conn:
        left = conn.execute("SELECT count(*) FROM pgqueuer").fetchone()
        logged, distinct = conn.execute(
            "SELECT count(*), count(DISTINCT job_id) FROM pgqueuer_log WHERE status = 'successful'"
        ).fetchone() or (0, 0)
        effects_ok, effects = effects_once(conn, n)
    remaining = left[0] if left else -1
    return {
        "ok": remaining == 0 and logged == distinct == n and effects_ok,
        "left_in_queue": remaining,
        "successful_log_rows": logged,
        "distinct_jobs": distinct,
        "effects": effects,
    }


def _workers(
    dsn: str,
    processes: int,
    batch: int | None,
    logdir: Path,
    ready: Path,
    env: dict[str, str],
    concurrency_limit: int | None = None,
) -> list[Any]:
    """``batch=None``: ``run()`` without batch_size; ``concurrency_limit``: the noop
    entrypoint's limit (None: the decorator's default)."""
    clean_dir(ready)
    argv = [PY, "-m", "bench.peers.pgqueuer_bench", "worker", dsn, "--ready-dir", str(ready)]
    if batch is not None:
        argv += ["--batch-size", str(batch)]
    if concurrency_limit is not None:
        argv += ["--concurrency-limit", str(concurrency_limit)]
    tag = f"b{batch if batch is not None else 'default'}"
    tag += f"l{concurrency_limit}" if concurrency_limit is not None else ""
    procs = [spawn(argv, logdir / f"pgqueuer-p{processes}{tag}.log", env) for _ in range(processes)]
    wait_ready_files(ready, processes)
    time.sleep(1.0)  # run() sets up LISTEN after the ready mark
    return procs


def burn_down(
    dsn: str,
    n: int,
    processes: int,
    batch: int | None,
    logdir: Path,
    ready: Path,
    concurrency_limit: int | None = None,
    entrypoint: str = "noop",
) -> dict[str, Any]:
    """``batch=None`` and ``concurrency_limit=None``: pgqueuer's own defaults.
    ``entrypoint``: one of ENTRYPOINT_LABELS."""
    truncate(dsn)
    procs = _workers(dsn, processes, batch, logdir, ready, {}, concurrency_limit)
    try:

        async def enqueue() -> None:
            conn = await asyncpg.connect(dsn)
            try:
                await Queries(AsyncpgDriver(conn)).enqueue([entrypoint] * n, [None] * n, [0] * n)
            finally:
                await conn.close()

        cpu0, w0 = cpu_snapshot([p.pid for p in procs]), time.time()
        asyncio.run(enqueue())
        t0 = time.time()
        done_q = "SELECT count(*) FROM pgqueuer_log WHERE status = 'successful'"
        wait_for(lambda: _count(dsn, done_q) >= n, 60 + n / 100, "pgqueuer burn-down", 0.25)
        window = time.time() - w0
        cpu = cpu_used(cpu0, window, [p.pid for p in procs])
        with psycopg.connect(dsn) as conn:
            row = conn.execute(
                "SELECT extract(epoch FROM max(created))::float8 FROM pgqueuer_log"
                " WHERE status = 'successful'"
            ).fetchone()
        t1 = float(row[0]) if row and row[0] else time.time()
    finally:
        for p in procs:
            stop(p)
    limit = (
        "no concurrency limit"
        if not concurrency_limit
        else f"entrypoint concurrency_limit={concurrency_limit}"
    )
    return {
        "setting": f"{processes} proc, batch_size={batch or DEFAULT_BATCH}, {limit}"
        + ENTRYPOINT_LABELS[entrypoint],
        "processes": processes,
        "batch_size": batch or DEFAULT_BATCH,
        "concurrency_limit": concurrency_limit or DEFAULT_LIMIT,
        "n": n,
        "seconds": round(t1 - t0, 4),
        "jobs_per_s": round(n / (t1 - t0), 1),
        "verify": verify(dsn, n),
        "cpu_cores": cpu,
        "cpu_us_per_job": cpu_per_job_us(cpu, window, n),
    }


def latency(
    dsn: str, rate: float, seconds: float, markdir: Path, logdir: Path, ready: Path
) -> dict[str, Any]:
    """Open-loop single ``Queries.enqueue`` calls, to one worker with default settings."""
    truncate(dsn)
    clean_dir(markdir)
    procs = _workers(dsn, 1, 10, logdir, ready, {"BENCH_MARK_DIR": str(markdir)})
    n = round(rate * seconds)
    try:

        @contextlib.asynccontextmanager
        async def sender() -> AsyncIterator[Send]:
            conn = await asyncpg.connect(dsn)  # one per sender thread
            try:
                queries = Queries(AsyncpgDriver(conn))

                async def send(i: int, intended: float) -> None:
                    await queries.enqueue("mark", f"{i} {intended:.6f}".encode())

                yield send
            finally:
                await conn.close()

        sent = open_loop(sender, rate, seconds)
        wait_for(lambda: len(read_marks(markdir)) >= n, 60, "pgqueuer latency jobs", 0.1)
        time.sleep(0.5)
        done_q = "SELECT count(*) FROM pgqueuer_log WHERE status = 'successful'"
        wait_for(lambda: _count(dsn, done_q) >= n, 30, "pgqueuer latency completions", 0.1)
    finally:
        for p in procs:
            stop(p)
    out = latency_summary(read_marks(markdir), n, sent)
    out["sender"] = sent
    out["verify"] = verify(dsn, n)
    out["ok"] = out["ok"] and out["verify"]["ok"]
    return out


# --------------------------------------------------------------------------- worker


async def _worker_main(
    dsn: str, batch_size: int | None, concurrency_limit: int | None, ready_dir: str | None
) -> None:
    """Only what was given is passed: without options, pgqueuer's defaults."""
    conn = await asyncpg.connect(dsn)
    qm = QueueManager(Queries(AsyncpgDriver(conn)))
    effects = await asyncpg.create_pool(dsn, min_size=1, max_size=EFFECT_POOL)

    async def noop(job: Job) -> None:
        return None

    def nothing(job: Job) -> None:
        return None

    async def noop_sync(job: Job) -> None:
        await asyncio.to_thread(nothing, job)

    async def effect(job: Job) -> None:
        async with effects.acquire() as c:  # one INSERT, its own commit
            await c.execute("INSERT INTO bench_effects (job_id) VALUES ($1)", job.id)

    handlers: list[tuple[str, Callable[[Job], Awaitable[None]]]] = [
        ("noop", noop),
        (SYNC_ENTRYPOINT, noop_sync),
        (EFFECT_ENTRYPOINT, effect),
    ]
    handlers += [(io_name(ms), io_handler(ms)) for ms in IO_WAITS_MS]
    for name, fn in handlers:
        if concurrency_limit is None:
            qm.entrypoint(name)(fn)
        else:
            qm.entrypoint(name, concurrency_limit=concurrency_limit)(fn)

    @qm.entrypoint("mark")
    async def mark(job: Job) -> None:
        i, t = (job.payload or b"").decode().split()
        record(int(i), float(t))

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, qm.shutdown.set)
    mark_ready(ready_dir)
    try:
        await (qm.run() if batch_size is None else qm.run(batch_size=batch_size))
    finally:
        await effects.close()
        await conn.close()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("command", choices=["worker"])
    p.add_argument("dsn")
    p.add_argument("--batch-size", type=int, help="QueueManager.run batch_size (default: its)")
    p.add_argument(
        "--concurrency-limit", type=int, help="the noop entrypoint's limit (default: its)"
    )
    p.add_argument("--ready-dir")
    args = p.parse_args()
    asyncio.run(_worker_main(args.dsn, args.batch_size, args.concurrency_limit, args.ready_dir))


if __name__ == "__main__":
    main()
