"""What the worker's per-job Python costs, piece by piece (DECISIONS 69 and 71):

    python -m bench.hotpath_cost

- decoding a claimed job's jsonb columns (payload ``null`` and the default backoff),
  by ``json.loads`` and by ``deadman.db.jsoncodec.loads``;
- encoding a finish batch of 200 (job_finish_many's ``batch``), by ``json.dumps`` and
  by ``jsoncodec.dumps``;
- a job's task: created with a name and two done-callbacks (as before 69), or unnamed
  with one ``functools.partial`` callback (as now), run to its end;
- psycopg's parse of the two longest queries, with every comment (as sent before 71)
  and as sent now.

No database: these are the client-side costs alone, in microseconds, best of 3.
"""

from __future__ import annotations

import asyncio
import functools
import json
import re
import time
import timeit
from collections.abc import Callable
from importlib import resources
from typing import Any

from psycopg._queries import PostgresQuery
from psycopg.adapt import Transformer

from deadman.db import jsoncodec
from deadman.db.queries import QUERIES

BACKOFF = b'{"strategy": "exponential", "base_ms": 1000, "max_ms": 300000, "jitter": "full"}'
BATCH = [
    {
        "id": 1_000_000 + i,
        "token": 5_000_000 + i,
        "state": "succeeded",
        "outcome": "succeeded",
        "delay_ms": 0,
        "error": None,
        "result": None,
    }
    for i in range(200)
]


def best_us(fn: Callable[[], object], number: int, per: int = 1) -> float:
    return min(timeit.repeat(fn, number=number, repeat=3)) / number / per * 1e6


def decode(loads: Callable[[bytes], Any]) -> float:
    return best_us(lambda: (loads(b"null"), loads(BACKOFF)), 100_000)


def encode(dumps: Callable[[Any], str]) -> float:
    return best_us(lambda: dumps(BATCH), 2_000, per=len(BATCH))


async def _noop() -> None:
    pass


async def tasks(named: bool, n: int = 50_000) -> float:
    """Microseconds per job task: created, run, its callbacks called."""
    live: set[asyncio.Task[None]] = set()

    def release(held: int) -> None:
        pass

    def done(held: int, task: asyncio.Task[None]) -> None:
        live.discard(task)
        release(held)

    t0 = time.perf_counter()
    for i in range(n):
        if named:
            task = asyncio.create_task(_noop(), name=f"job-{i}")
            live.add(task)
            task.add_done_callback(live.discard)

            def callback(_t: asyncio.Task[None], held: int = i) -> None:  # the old lambda
                release(held)

            task.add_done_callback(callback)
        else:
            task = asyncio.create_task(_noop())
            live.add(task)
            task.add_done_callback(functools.partial(done, i))
        if i % 200 == 199:  # a claim's worth of jobs, then the loop runs them
            await asyncio.sleep(0)
    await asyncio.gather(*live)
    return (time.perf_counter() - t0) / n * 1e6


def parse_us(sql: str) -> float:
    params = {name: 1 for name in re.findall(r"%\((\w+)\)s", sql)}
    transformer = Transformer()
    return best_us(lambda: PostgresQuery(transformer).convert(sql, params), 20_000)


def with_comments() -> dict[str, str]:
    """The queries as the loader sent them before 71: every comment line kept."""
    text = resources.files("deadman.db").joinpath("queries.sql").read_text(encoding="utf-8")
    parts = re.split(r"^-- name: ([a-z_][a-z0-9_]*)\s*$", text, flags=re.MULTILINE)
    return {name: body.strip() for name, body in zip(parts[1::2], parts[2::2], strict=True)}


def main() -> None:
    print(
        f"decode payload + backoff: json {decode(json.loads):.2f} us/job, jsoncodec"
        f" {decode(jsoncodec.loads):.2f}"
    )
    old = functools.partial(json.dumps, ensure_ascii=False)
    print(
        f"encode a finish batch of 200: json {encode(old):.2f} us/job, jsoncodec"
        f" {encode(jsoncodec.dumps):.2f}"
    )
    named = min(asyncio.run(tasks(True)) for _ in range(3))
    unnamed = min(asyncio.run(tasks(False)) for _ in range(3))
    print(f"a job's task: named, 2 callbacks {named:.2f} us; unnamed, 1 partial {unnamed:.2f}")
    before = with_comments()
    for name in ("job_finish_claim", "job_claim_left"):
        print(
            f"psycopg parse of {name}: {len(before[name].encode())} B {parse_us(before[name]):.1f}"
            f" us, as sent now {len(QUERIES[name].encode())} B {parse_us(QUERIES[name]):.1f} us"
        )


if __name__ == "__main__":
    main()
