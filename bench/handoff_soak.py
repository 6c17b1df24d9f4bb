"""A parked worker fed one job at a time for a while: does the enqueue call stay flat?

    python -m bench.handoff_soak                    # 60 s at 200 jobs/s
    python -m bench.handoff_soak --seconds 30 --rate 100

One ``deadman worker`` (one process, concurrency 10, the bench's ``bench_mark``
handler) on a fresh database of a private durable cluster; one ``Client`` enqueues
jobs one by one at ``--rate``, paced (a spin to each intended time), so nearly every
job is handed to a parked slot (DECISIONS 83). Reported per fifth of the run: the
enqueue call's p50 (``perf_counter`` around ``Client.enqueue``) and intended send →
handler start p50; at the end, the size of ``deadman.parked`` and how many jobs were
handed off. This is what found the slot table's bloat (DECISIONS 85): before it, the
call's p50 doubled within half a minute, until autovacuum came. Every job must start
exactly once.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg

from bench.common import (
    clean_dir,
    create_database,
    durable_cluster,
    machine,
    read_marks,
    stop,
    wait_for,
)
from bench.deadman_bench import _wait_workers, _worker, setup
from deadman import Client


def soak(dsn: str, rate: float, seconds: float, workdir: Path) -> dict[str, Any]:
    markdir = clean_dir(workdir / "marks")
    proc = _worker(dsn, 1, 10, workdir / "worker.log", {"BENCH_MARK_DIR": str(markdir)})
    n = round(rate * seconds)
    calls: list[float] = []
    intended: list[float] = []
    try:
        _wait_workers(dsn, 1)
        with Client(dsn) as client:
            client.get(0)  # connected before the clock starts
            start = time.perf_counter() + 0.5
            wall = time.time() - time.perf_counter()
            for i in range(n):
                at = start + i / rate
                while time.perf_counter() < at:
                    pass
                t = time.perf_counter()
                client.enqueue("bench_mark", {"i": i, "t": wall + at})
                calls.append((time.perf_counter() - t) * 1000)
                intended.append(wall + at)
        wait_for(lambda: len(read_marks(markdir)) >= n, 60, "every job started")
    finally:
        stop(proc)
    marks = {i: started for i, _, started in read_marks(markdir)}
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT pg_relation_size('deadman.parked'),"
            " (SELECT count(*) FROM deadman.jobs WHERE started_at = created_at),"
            " (SELECT count(*) FROM deadman.jobs WHERE state = 'succeeded'),"
            " (SELECT count(*) FROM deadman.attempts)"
        ).fetchone()
    assert row is not None
    size, handed, succeeded, attempts = row
    fifth = max(1, n // 5)
    windows = [
        {
            "from_s": round(s / rate, 1),
            "enqueue_call_p50_ms": round(statistics.median(calls[s : s + fifth]), 3),
            "total_p50_ms": round(
                statistics.median(
                    (marks[i] - intended[i]) * 1000 for i in range(s, min(n, s + fifth))
                ),
                3,
            ),
        }
        for s in range(0, n - fifth + 1, fifth)
    ]
    return {
        "jobs": n,
        "rate": rate,
        "windows": windows,
        "parked_table_bytes": int(size),
        "handed_off": int(handed),
        "exactly_once": len(marks) == n and int(succeeded) == n and int(attempts) == n,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--rate", type=float, default=200.0)
    a = ap.parse_args(argv)
    with durable_cluster() as cluster:
        dsn = create_database(cluster, "handoff_soak")
        setup(dsn)
        info = machine(dsn)
        out = soak(dsn, a.rate, a.seconds, Path(tempfile.mkdtemp(prefix="deadman-soak-")))
    for w in out["windows"]:
        print(
            f"from {w['from_s']:>5} s: enqueue call p50 {w['enqueue_call_p50_ms']} ms,"
            f" intended send -> handler p50 {w['total_p50_ms']} ms"
        )
    print(json.dumps({k: v for k, v in out.items() if k != "windows"} | {"cpu": info["cpu"]}))
    return 0 if out["exactly_once"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
