"""What a cross-shard read costs: the first page of ``GET /jobs`` (the API's own
``job_list`` statement, 50 newest) on one shard, against the same page merged from
three shards (deadman.shards): one ``job_list`` per shard, merged by ``created_at``
(ids no longer sort by time across shards: each shard's ids start at index << 48),
the 50 newest kept. Merged two ways: the three statements in series (3 round trips
one after another), and concurrently (3 connections, asyncio.gather: the slowest of
3). Reps interleaved so a busy machine slows every shape alike. And what routing adds
to one enqueue (ShardedClient against a plain Client on the same shard).

A listing filtered by queue needs no merge: the router sends it to that queue's
shard, so it costs what "one shard" costs. Three durable local clusters
(bench.common.durable_cluster), each migrated, initialised as a shard and seeded with
``--jobs`` queued jobs. Loopback only: across
a network every round trip adds its RTT, once per shard in series, once in all
concurrently.

``.venv-bench/bin/python -m bench.shards_listing [--jobs 20000] [--reps 400]``; the
raw JSON goes to bench/results/shards-listing-<time>.json.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import time
from datetime import UTC, datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row

from bench.common import ROOT, durable_cluster, machine, pct
from deadman.client import Client
from deadman.db.migrate import migrate
from deadman.db.queries import QUERIES
from deadman.shards import ShardedClient, ShardMap
from deadman.shards.ids import initialise

PAGE = 50
SHAPES = ("one shard", "3 shards, in series", "3 shards, concurrent")


def _params(state: str | None) -> dict[str, Any]:
    return {
        "state": state,
        "type": None,
        "queue": None,
        "before": None,
        "floor": None,
        "limit": PAGE,
    }


def _merged(pages: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    rows = [r for page in pages for r in page]
    rows.sort(key=lambda r: (r["created_at"], r["id"]), reverse=True)
    return rows[:PAGE]


async def _page(conn: psycopg.AsyncConnection[Any], state: str | None) -> list[dict[str, Any]]:
    cur = await conn.execute(QUERIES["job_list"], _params(state), prepare=False)
    return await cur.fetchall()


async def _run(dsns: list[str], reps: int, state: str | None) -> dict[str, list[float]]:
    conns = [
        await psycopg.AsyncConnection.connect(d, autocommit=True, row_factory=dict_row)
        for d in dsns
    ]
    timings: dict[str, list[float]] = {s: [] for s in SHAPES}
    try:
        for _ in range(20):  # warm: caches, catalog, first plans
            await asyncio.gather(*(_page(c, state) for c in conns))
        for _ in range(reps):
            t = time.perf_counter()
            single = await _page(conns[0], state)
            timings["one shard"].append(time.perf_counter() - t)
            t = time.perf_counter()
            series = _merged([await _page(c, state) for c in conns])
            timings["3 shards, in series"].append(time.perf_counter() - t)
            t = time.perf_counter()
            together = _merged(list(await asyncio.gather(*(_page(c, state) for c in conns))))
            timings["3 shards, concurrent"].append(time.perf_counter() - t)
            assert len(single) == PAGE and series == together and len(together) == PAGE
    finally:
        for c in conns:
            await c.close()
    return timings


def _enqueues(dsns: list[str], reps: int) -> dict[str, dict[str, Any]]:
    """One enqueue through a plain Client on shard 1, against one through the
    ShardedClient to the same shard (the job built and checked once more to find its
    queue, the map looked up): what the routing adds to a call, interleaved."""
    spec = {
        f"s{i}": {"index": i, "url": dsn, "queues": [f"q{i}"]}
        for i, dsn in enumerate(dsns, start=1)
    }
    plain_ms: list[float] = []
    routed_ms: list[float] = []
    with Client(dsns[0]) as plain, ShardedClient(ShardMap.parse(json.dumps(spec))) as routed:
        for _ in range(20):
            plain.enqueue("noop", queue="q1")
            routed.enqueue("noop", queue="q1")
        for _ in range(reps):
            t = time.perf_counter()
            plain.enqueue("noop", {"x": 1}, queue="q1")
            plain_ms.append(time.perf_counter() - t)
            t = time.perf_counter()
            routed.enqueue("noop", {"x": 1}, queue="q1")
            routed_ms.append(time.perf_counter() - t)
    return {"Client.enqueue": _summary(plain_ms), "ShardedClient.enqueue": _summary(routed_ms)}


def _seed(dsn: str, index: int, jobs: int) -> None:
    migrate(dsn)
    initialise(dsn, index)
    with Client(dsn) as client:
        for start in range(0, jobs, 5000):
            n = min(5000, jobs - start)
            batch = [client.job("noop", {"i": start + i}, queue=f"q{index}") for i in range(n)]
            client.enqueue_many(batch)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE deadman.jobs")


def _summary(values: list[float]) -> dict[str, Any]:
    ms = sorted(v * 1000 for v in values)
    return {"n": len(ms), "p50_ms": pct(ms, 50), "p95_ms": pct(ms, 95), "p99_ms": pct(ms, 99)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=20000, help="queued jobs seeded per shard")
    ap.add_argument("--reps", type=int, default=400)
    args = ap.parse_args(argv)
    with contextlib.ExitStack() as stack:
        clusters = [stack.enter_context(durable_cluster()) for _ in range(3)]
        dsns = [c.dsn() for c in clusters]
        for index, dsn in enumerate(dsns, start=1):
            _seed(dsn, index, args.jobs)
        result: dict[str, Any] = {
            "when": datetime.now(UTC).isoformat(),
            "jobs_per_shard": args.jobs,
            "page": PAGE,
            "machine": machine(dsns[0]),
        }
        for label, state in (("unfiltered", None), ("state=queued", "queued")):
            timings = asyncio.run(_run(dsns, args.reps, state))
            result[label] = {shape: _summary(timings[shape]) for shape in SHAPES}
        result["enqueue"] = _enqueues(dsns, args.reps)
    out = ROOT / "bench" / "results" / f"shards-listing-{datetime.now(UTC):%Y%m%dT%H%M%SZ}.json"
    out.write_text(json.dumps(result, indent=2, default=str) + "\n")
    for label in ("unfiltered", "state=queued"):
        for shape in SHAPES:
            s = result[label][shape]
            print(
                f"{label:>10} | {shape:<22} | p50 {s['p50_ms']} ms"
                f"  p95 {s['p95_ms']} ms  p99 {s['p99_ms']} ms"
            )
    for name, s in result["enqueue"].items():
        print(f"   enqueue | {name:<22} | p50 {s['p50_ms']} ms  p95 {s['p95_ms']} ms")
    print(f"raw: {out.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
