"""Where the queue's side of start latency goes, job by job: enqueue acknowledged →
NOTIFY seen by the worker's listener → claim sent → claim returned → the handler's
first line. One in-process worker (a thread, concurrency 10) on ``--database-url``;
``--jobs`` single ``Client.enqueue`` calls from this thread, one every 20 ms; the
marks are ``time.perf_counter`` on both sides (one process, one clock), taken by
wrapping ``Listener._dispatch`` and ``AsyncStore.job_claim``. Medians over the jobs
after the first 20. Bounded: ``--jobs`` jobs, 10 s for the worker to stop.

The sender shares the worker's process (and its GIL) here, so the absolute figures
are not the latency benchmark's; compare revisions with ``PYTHONPATH=<checkout>``.

    .venv-bench/bin/python -m bench.start_split --database-url postgresql://... --jobs 400
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import threading
import time
from typing import Any

from deadman import Client
from deadman.config import Settings
from deadman.model import Job
from deadman.registry import Registry
from deadman.store import AsyncStore, ClaimParams
from deadman.worker.context import JobContext
from deadman.worker.listener import Listener
from deadman.worker.process import Worker

WARMUP = 20
STEPS = ("acked", "notify", "sent", "returned", "start")


def run(dsn: str, jobs: int) -> dict[str, float]:
    marks: dict[str, dict[int, float]] = {step: {} for step in STEPS}
    last_notify = [0.0]
    dispatch = Listener._dispatch
    claim = AsyncStore.job_claim

    def seen(self: Listener, channel: str, payload: str) -> None:
        last_notify[0] = time.perf_counter()
        dispatch(self, channel, payload)

    async def timed(self: AsyncStore, p: ClaimParams, retry_s: float | None = None) -> list[Job]:
        sent = time.perf_counter()
        got = await claim(self, p, retry_s)
        returned = time.perf_counter()
        for job in got:
            marks["notify"][job.id] = last_notify[0]
            marks["sent"][job.id] = sent
            marks["returned"][job.id] = returned
        return got

    registry = Registry()

    async def probe(job: Job, ctx: JobContext) -> None:
        marks["start"][job.id] = time.perf_counter()

    registry.register("probe", probe)
    Listener._dispatch = seen  # type: ignore[method-assign]
    AsyncStore.job_claim = timed  # type: ignore[method-assign,assignment]
    ready = threading.Event()
    state: dict[str, Any] = {}

    def serve() -> None:
        async def main() -> None:
            worker = Worker(dsn, Settings(concurrency=10), registry)
            state["worker"], state["loop"] = worker, asyncio.get_running_loop()
            ready.set()
            await worker.run()

        asyncio.run(main())

    thread = threading.Thread(target=serve, daemon=True)
    try:
        thread.start()
        if not ready.wait(10):
            raise RuntimeError("the worker did not start")
        with Client(dsn) as client:
            client.enqueue("probe")  # the listener is up once this one ran
            deadline = time.monotonic() + 10
            while not marks["start"] and time.monotonic() < deadline:
                time.sleep(0.05)
            for _ in range(jobs):
                job = client.enqueue("probe")
                marks["acked"][job.id] = time.perf_counter()
                time.sleep(0.02)
        deadline = time.monotonic() + 10
        while not set(marks["acked"]) <= set(marks["start"]) and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        if "loop" in state:
            state["loop"].call_soon_threadsafe(state["worker"].request_stop)
        thread.join(10)
        Listener._dispatch = dispatch  # type: ignore[method-assign]
        AsyncStore.job_claim = claim  # type: ignore[method-assign]
    ids = [i for i in marks["acked"] if all(i in marks[s] for s in STEPS)][WARMUP:]
    if not ids:
        raise RuntimeError("no job went through every step")

    def median(a: str, b: str) -> float:
        return statistics.median(marks[b][i] - marks[a][i] for i in ids) * 1000

    return {
        "jobs": float(len(ids)),
        "acked → notify seen (ms; negative: seen before the ack returned)": median(
            "acked", "notify"
        ),
        "notify seen → claim sent (ms)": median("notify", "sent"),
        "claim round trip (ms)": median("sent", "returned"),
        "claim returned → handler (ms)": median("returned", "start"),
        "acked → handler (ms)": median("acked", "start"),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--database-url", required=True)
    ap.add_argument("--jobs", type=int, default=400)
    args = ap.parse_args()
    for name, value in run(args.database_url, args.jobs).items():
        print(f"{name:66} {value:8.3f}")


if __name__ == "__main__":
    main()
