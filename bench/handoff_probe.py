"""A probe of a design Deadman does not have yet: what would handing a job to a waiting
worker inside the enqueue's own statement do to enqueue → handler latency at 200/s?
(Issue 16's latency target; DECISIONS, "Noted: a handoff at enqueue halves the
latency at 200/s".)

    python -m bench.handoff_probe [--jobs 2000] [--reps 2]

Two ways from a sender's INSERT to a handler's first line, on one private durable
cluster (fsync and ``synchronous_commit`` on), 200 jobs/s offered, open loop (each send
at its intended time; latency from the intended time, as ``bench.deadman_bench``
measures it), the modes taking turns rep by rep, each run after a CHECKPOINT:

- **claim** (Deadman today): the INSERT commits a queued job; its statement trigger's
  NOTIFY wakes the listener, which runs the worker's real claim
  (``AsyncStore.job_claim``) and starts the job on the rows it returns.
- **handoff** (the probe): ONE statement takes a slot of a parked worker's row
  (``FOR UPDATE SKIP LOCKED``), inserts the job already running under a lease for that
  worker (its token from ``deadman.lease_token_seq``) and sends the row as the
  notification's payload; the listener starts the job on the payload, with no claim
  round trip. The lease is durable with the enqueue's commit.

Both modes send through ``bench.common.open_loop``, as the latency phase does (four
sender threads), each thread with a bare psycopg connection (autocommit, one prepared
statement per job), not ``Client.enqueue``: the absolute figures are not `make bench`'s (though
its claim mode came out near them), the difference between the modes is the point.
The handoff SQL and the parked table here are scratch (``bench_parked``), none of
Deadman's guarantees (order, limits, pauses, quarantine, a parked worker's death) are
in it: it measures the latency a full design could reach, not the design. Each run
also times the sender's calls: what the handoff's statement costs the enqueuer. Raw
JSON under bench/results/handoff-*.json.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, LiteralString

import orjson
import psycopg
import uvloop

from bench.common import Send, create_database, durable_cluster, machine, open_loop, pct
from deadman.db.migrate import migrate
from deadman.db.pool import async_pool
from deadman.store import AsyncStore
from deadman.store.leases import ClaimParams

RATE = 200.0
WORKER = "probe-w1"
CLAIM_SQL = (
    "INSERT INTO deadman.jobs (type, queue, payload) VALUES ('noop', 'default', %s) RETURNING id"
)
HANDOFF_SQL = """
WITH p AS (
    UPDATE bench_parked SET slots = slots - 1
    WHERE worker = (SELECT worker FROM bench_parked WHERE queue = 'default' AND slots > 0
                    LIMIT 1 FOR UPDATE SKIP LOCKED)
    RETURNING worker
), j AS (
    INSERT INTO deadman.jobs (type, queue, payload, state, attempt, lease_token, lease_worker,
                              lease_expires_at, started_at)
    SELECT 'noop', 'default', %s, 'running', 1, nextval('deadman.lease_token_seq'), p.worker,
           now() + interval '10 s', now()
    FROM p
    RETURNING *
)
SELECT j.id, pg_notify('handoff_' || replace(j.lease_worker, '-', '_'), row_to_json(j)::text)
FROM j
"""
CHANNEL = "handoff_" + WORKER.replace("-", "_")


def _sender(dsn: str, mode: str) -> contextlib.AbstractAsyncContextManager[Send]:
    """One connection per sender thread of ``bench.common.open_loop`` (autocommit, the
    mode's statement prepared), connected before the clock starts."""
    query = HANDOFF_SQL if mode == "handoff" else CLAIM_SQL

    @contextlib.asynccontextmanager
    async def sender() -> AsyncIterator[Send]:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:

            async def send(i: int, intended: float) -> None:
                cur = await conn.execute(
                    query, (json.dumps({"i": i, "t": intended}),), prepare=True
                )
                if await cur.fetchone() is None:
                    raise AssertionError(f"{mode}: job {i} was not inserted")

            yield send

    return sender()


async def _run(dsn: str, mode: str, n: int) -> tuple[list[float], list[float]]:
    """One run: every job's latency in ms (intended send → its start on the listener),
    and every enqueue call's duration in ms, both sorted."""
    started: dict[int, float] = {}
    pool = async_pool(dsn, name="probe")
    await pool.open()
    store = AsyncStore(pool)
    listener = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
    try:
        await listener.execute("LISTEN deadman_jobs")
        await listener.execute(f"LISTEN {CHANNEL}")
        claim = ClaimParams(
            queue="default", worker=WORKER, limit=10, ttl_ms=10_000, quarantine_at=5
        )
        # the sender threads (bench.common.open_loop, as the latency phase sends) in
        # a thread of their own: this loop only listens and claims
        sending = asyncio.ensure_future(
            asyncio.to_thread(open_loop, lambda: _sender(dsn, mode), RATE, n / RATE)
        )
        notifies = listener.notifies()
        deadline = time.monotonic() + n / RATE + 30
        while len(started) < n and time.monotonic() < deadline:
            note = await asyncio.wait_for(anext(notifies), 30)
            if note.channel == CHANNEL:
                payload = orjson.loads(note.payload)["payload"]
                started[payload["i"]] = time.time() - payload["t"]
            else:
                for job in await store.job_claim(claim, retry_s=0):
                    now = time.time()
                    started[job.payload["i"]] = now - job.payload["t"]
        sent = await sending
    finally:
        await listener.close()
        await pool.close()
    if len(started) != n:
        raise AssertionError(f"{mode}: {len(started)} of {n} jobs started")
    calls = sorted(v * 1000 for v in sent["call_s"].values())
    return sorted(v * 1000 for v in started.values()), calls


#: before every run: empty tables, one parked worker with slots to spare, a checkpoint
PREPARE: tuple[tuple[LiteralString, tuple[str, ...]], ...] = (
    (
        "CREATE TABLE IF NOT EXISTS bench_parked (worker text PRIMARY KEY, queue text, slots int)",
        (),
    ),
    ("TRUNCATE deadman.jobs, deadman.attempt_log, bench_parked CASCADE", ()),
    ("INSERT INTO bench_parked VALUES (%s, 'default', 1000000000)", (WORKER,)),
    ("VACUUM ANALYZE deadman.jobs", ()),
    ("CHECKPOINT", ()),
)


def _prepare(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for statement, params in PREPARE:
            conn.execute(statement, params)


def _summary(ms: list[float]) -> dict[str, float | None]:
    return {f"p{p}": pct(ms, p) for p in (50, 90, 99, 99.9)}


def _line(ms: list[float]) -> str:
    return "  ".join(f"{k} {v:.3f}" for k, v in _summary(ms).items() if v is not None) + " ms"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.handoff_probe", description=__doc__)
    ap.add_argument("--jobs", type=int, default=2000, help="jobs per run (200/s)")
    ap.add_argument("--reps", type=int, default=2, help="runs per mode, taking turns")
    ap.add_argument("--out", type=Path, help="raw JSON path")
    args = ap.parse_args(argv)
    if not 10 <= args.jobs <= 20_000 or not 1 <= args.reps <= 10:
        ap.error("--jobs 10-20,000 and --reps 1-10")
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    runs: dict[str, list[dict[str, Any]]] = {"claim": [], "handoff": []}
    with durable_cluster() as cluster:
        dsn = create_database(cluster, "handoff_probe")
        migrate(dsn)
        box = machine(dsn)
        for rep in range(args.reps):
            for mode in runs:
                _prepare(dsn)
                ms, calls = uvloop.run(_run(dsn, mode, args.jobs))
                runs[mode].append({**_summary(ms), "enqueue_call": _summary(calls)})
                print(f"rep {rep + 1} {mode:8s} {_line(ms)}; enqueue call {_line(calls)}")
    doc = {"started_at": stamp, "machine": box, "jobs": args.jobs, "rate": RATE, "runs": runs}
    out = args.out or Path(__file__).parent / "results" / f"handoff-{stamp}.json"
    out.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    print(f"raw: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
