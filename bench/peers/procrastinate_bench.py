"""procrastinate under the same benchmarks, through its own documented API.

- Bulk enqueue: ``Task.batch_defer_async`` (one statement for the whole batch).
- Workers: ``App.run_worker_async(concurrency=C)`` per process, LISTEN/NOTIFY on.
- Verification: every job ends 'succeeded' and ``procrastinate_events`` holds
  exactly one 'started' event per job.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import procrastinate
import psycopg
from procrastinate.worker import WORKER_CONCURRENCY

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

NAME = "procrastinate"
POLLING = float(os.environ.get("BENCH_PRO_POLLING", "5.0"))
#: The sync shapes' task: a plain ``def``, which procrastinate runs in a thread.
SYNC_TASK = "noop_sync"
#: The effect shapes' task: one row into ``bench_effects`` per job, one INSERT
#: committed on its own through the app's connector (its psycopg pool), at least once
#: (procrastinate records the outcome in a statement of its own).
EFFECT_TASK = "effect"
#: what a burn-down's setting says about its task
TASK_LABELS = {
    "noop": "",
    SYNC_TASK: ", a sync task",
    EFFECT_TASK: ", one INSERT",
    **IO_LABELS,
}
# procrastinate's own default, read from the installed version (not assumed).
DEFAULT_CONCURRENCY: int = WORKER_CONCURRENCY


def make_app(dsn: str) -> procrastinate.App:
    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=dsn))

    @app.task(name="noop")
    async def noop() -> None:
        return None

    @app.task(name=SYNC_TASK)
    def noop_sync() -> None:
        return None

    @app.task(name=EFFECT_TASK, pass_context=True)
    async def effect(context: procrastinate.JobContext) -> None:
        assert context.job is not None
        await app.connector.execute_query_async(
            "INSERT INTO bench_effects (job_id) VALUES (%(job_id)s)", job_id=context.job.id
        )

    for ms in IO_WAITS_MS:
        app.task(name=io_name(ms))(io_handler(ms))

    @app.task(name="mark")
    async def mark(i: int, t: float) -> None:
        record(i, t)

    return app


def setup(dsn: str) -> None:
    async def main() -> None:
        app = make_app(dsn)
        async with app.open_async():
            await app.schema_manager.apply_schema_async()
            await app.connector.execute_query_async(EFFECTS_DDL)

    asyncio.run(main())


def truncate(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "TRUNCATE procrastinate_jobs, procrastinate_events, procrastinate_periodic_defers,"
            " procrastinate_workers, bench_effects RESTART IDENTITY CASCADE"
        )
        conn.execute("VACUUM ANALYZE procrastinate_jobs")


def _count(dsn: str, query: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(query).fetchone()
    return int(row[0]) if row else 0


async def _defer_many(
    dsn: str, n: int, per_call: int | None = None, task_name: str = "noop"
) -> float:
    """Seconds for ``batch_defer_async`` of n jobs, in one call or in calls of
    ``per_call`` jobs one after another (all of them timed)."""
    size = per_call or n
    app = make_app(dsn)
    async with app.open_async():
        task = app.tasks[task_name]
        await app.connector.execute_query_async("SELECT 1")  # warm the pool
        ids: list[int] = []
        t0 = time.perf_counter()
        for start in range(0, n, size):
            ids += await task.batch_defer_async(*({} for _ in range(min(size, n - start))))
        elapsed = time.perf_counter() - t0
    if len(ids) != n:
        raise AssertionError(f"procrastinate stored {len(ids)} of {n}")
    return elapsed


def bulk_enqueue(dsn: str, n: int, per_call: int | None = None) -> float:
    truncate(dsn)
    elapsed = asyncio.run(_defer_many(dsn, n, per_call))
    if _count(dsn, "SELECT count(*) FROM procrastinate_jobs") != n:
        raise AssertionError("procrastinate enqueue lost jobs")
    return elapsed


def verify(dsn: str, n: int) -> dict[str, Any]:
    with psycopg.connect(dsn) as conn:
        jobs, succeeded = conn.execute(
            "SELECT count(*), count(*) FILTER (WHERE status = 'succeeded') FROM procrastinate_jobs"
        ).fetchone() or (0, 0)
        started, distinct = conn.execute(
            "SELECT count(*), count(DISTINCT job_id) FROM procrastinate_events"
            " WHERE type = 'started'"
        ).fetchone() or (0, 0)
        effects_ok, effects = effects_once(conn, n)
    return {
        "ok": jobs == succeeded == started == distinct == n and effects_ok,
        "effects": effects,
        "jobs": jobs,
        "succeeded": succeeded,
        "started_events": started,
        "distinct_started": distinct,
    }


def _workers(
    dsn: str,
    processes: int,
    concurrency: int | None,
    logdir: Path,
    ready: Path,
    env: dict[str, str],
) -> list[Any]:
    """``concurrency=None``: ``run_worker_async`` with no options (its defaults)."""
    clean_dir(ready)
    argv = [PY, "-m", "bench.peers.procrastinate_bench", "worker", dsn, "--ready-dir", str(ready)]
    if concurrency is not None:
        argv += ["--concurrency", str(concurrency), "--polling", str(POLLING)]
    label = "default" if concurrency is None else str(concurrency)
    procs = [
        spawn(argv, logdir / f"procrastinate-p{processes}c{label}.log", env)
        for _ in range(processes)
    ]
    wait_ready_files(ready, processes)
    time.sleep(1.0)  # the worker LISTENs right after the ready mark
    return procs


def burn_down(
    dsn: str,
    n: int,
    processes: int,
    concurrency: int | None,
    logdir: Path,
    ready: Path,
    task: str = "noop",
) -> dict[str, Any]:
    """``concurrency=None``: procrastinate's defaults (no worker options). ``task``:
    ``noop`` or SYNC_TASK."""
    truncate(dsn)
    procs = _workers(dsn, processes, concurrency, logdir, ready, {})
    try:
        cpu0, w0 = cpu_snapshot([p.pid for p in procs]), time.time()
        asyncio.run(_defer_many(dsn, n, task_name=task))
        t0 = time.time()
        done_q = "SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'"
        wait_for(lambda: _count(dsn, done_q) >= n, 60 + n / 50, "procrastinate burn-down", 0.25)
        window = time.time() - w0
        cpu = cpu_used(cpu0, window, [p.pid for p in procs])
        with psycopg.connect(dsn) as conn:
            row = conn.execute(
                "SELECT extract(epoch FROM max(at))::float8 FROM procrastinate_events"
                " WHERE type = 'succeeded'"
            ).fetchone()
        t1 = float(row[0]) if row and row[0] else time.time()
    finally:
        for p in procs:
            stop(p)
    conc = DEFAULT_CONCURRENCY if concurrency is None else concurrency
    return {
        "setting": f"{processes} proc, concurrency={conc}" + TASK_LABELS[task],
        "processes": processes,
        "concurrency": conc,
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
    """Open-loop single ``defer_async`` calls, to one worker with concurrency 10."""
    truncate(dsn)
    clean_dir(markdir)
    procs = _workers(dsn, 1, 10, logdir, ready, {"BENCH_MARK_DIR": str(markdir)})
    n = round(rate * seconds)
    try:

        @contextlib.asynccontextmanager
        async def sender() -> AsyncIterator[Send]:
            app = make_app(dsn)  # one per sender thread, with its own pool
            async with app.open_async():
                task = app.tasks["mark"]
                await app.connector.execute_query_async("SELECT 1")

                async def send(i: int, intended: float) -> None:
                    await task.defer_async(i=i, t=intended)

                yield send

        sent = open_loop(sender, rate, seconds)
        wait_for(lambda: len(read_marks(markdir)) >= n, 60, "procrastinate latency jobs", 0.1)
        time.sleep(0.5)
        done_q = "SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'"
        wait_for(lambda: _count(dsn, done_q) >= n, 30, "procrastinate completions", 0.1)
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
    dsn: str, concurrency: int | None, polling: float | None, ready_dir: str | None
) -> None:
    """Only what was given is passed: without options, procrastinate's defaults."""
    app = make_app(dsn)
    options: dict[str, Any] = {}
    if concurrency is not None:
        options["concurrency"] = concurrency
    if polling is not None:
        options["fetch_job_polling_interval"] = polling
    async with app.open_async():
        mark_ready(ready_dir)
        await app.run_worker_async(**options)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("command", choices=["worker"])
    p.add_argument("dsn")
    p.add_argument("--concurrency", type=int, help="run_worker_async concurrency (default: its)")
    p.add_argument("--polling", type=float, help="fetch_job_polling_interval (default: its)")
    p.add_argument("--ready-dir")
    args = p.parse_args()
    asyncio.run(_worker_main(args.dsn, args.concurrency, args.polling, args.ready_dir))


if __name__ == "__main__":
    main()
