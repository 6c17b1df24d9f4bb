"""A parked worker fed one job at a time for a while: does the enqueue call stay flat?

    python -m bench.handoff_soak                    # 60 s at 200 jobs/s
    python -m bench.handoff_soak --seconds 30 --rate 100
    python -m bench.handoff_soak --base 8d6973e     # that commit vs this checkout

One ``deadman worker`` (one process, concurrency 10, the bench's ``bench_mark``
handler) on a fresh database of a private durable cluster; one ``Client`` enqueues
jobs one by one at ``--rate``, paced (a spin to each intended time), so nearly every
job is handed to a parked slot (DECISIONS 83). Reported per fifth of the run: the
enqueue call's p50 (``perf_counter`` around ``Client.enqueue``) and intended send →
handler start p50; at the end, the size of ``deadman.parked`` and how many jobs were
handed off. This is what found the slot table's bloat (DECISIONS 85): before it, the
call's p50 doubled within half a minute, until autovacuum came. Every job must start
exactly once.

With ``--base``, before/after as ``bench.ab`` does it: each side soaks from its own tree
(its worker, its statements, its migrations) in its own database of one private
durable cluster, the sides take turns rep by rep (which goes first alternates), and
each side's figures are the medians over its reps of the run's window p50s. Raw
results: ``bench/results/handoff-soak-ab-<time>.json``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg

from bench.ab import paired_ratio, rep_order, run_driver, two_sides
from bench.common import (
    clean_dir,
    create_database,
    durable_cluster,
    machine,
    median,
    read_marks,
    stop,
    wait_for,
    write_results,
)
from bench.deadman_bench import _wait_workers, _worker, setup
from deadman import Client

# Run inside the side's tree: its own soak drives its own worker and client.
DRIVER = """
import json, sys, tempfile
from pathlib import Path
from bench import handoff_soak as hs
from bench.deadman_bench import setup, truncate
dsn, rate, seconds = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
if sys.argv[4] == "setup":
    setup(dsn)
    raise SystemExit(0)
# every rep on an empty database: the soak counts what is in it (a tree from before
# truncate emptied deadman.parked reports the slot table's size with the old rows in it)
truncate(dsn)
print(json.dumps(hs.soak(dsn, rate, seconds, Path(tempfile.mkdtemp(prefix="deadman-soak-")))))
"""


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
            "enqueue_call_p50_ms": round(median(calls[s : s + fifth]), 3),
            "total_p50_ms": round(
                median([(marks[i] - intended[i]) * 1000 for i in range(s, min(n, s + fifth))]),
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
    ap.add_argument("--base", help="before/after: the 'before' revision (a commit)")
    ap.add_argument("--rev", default=".", help="with --base: the 'after' revision")
    ap.add_argument("--reps", type=int, default=2, help="with --base: even, runs per side")
    a = ap.parse_args(argv)
    if a.base:
        return compare(a.base, a.rev, a.rate, a.seconds, a.reps)
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


#: a soak's two figures, each the median of its windows' p50s
FIGURES = ("enqueue_call_p50_ms", "total_p50_ms")


def compare(base: str, rev: str, rate: float, seconds: float, reps: int) -> int:
    """``--base``: the soak for two revisions, taking turns (module docstring)."""
    runs: dict[str, list[dict[str, Any]]] = {"before": [], "after": []}
    args = [str(rate), str(seconds)]
    with two_sides(base, rev, "handoff_soak") as (sides, dsns, info):
        for side, (tree, _) in sides.items():
            run_driver(tree, DRIVER, [dsns[side], *args, "setup"])
        for rep in range(reps):
            for side in rep_order(rep):
                tree, commit = sides[side]
                r = run_driver(tree, DRIVER, [dsns[side], *args, "run"])
                r |= {f: median([w[f] for w in r["windows"]]) for f in FIGURES}
                runs[side].append(r)
                print(
                    f"rep {rep + 1} {side} ({commit}): enqueue call p50"
                    f" {r['enqueue_call_p50_ms']:.3f} ms, intended send -> handler p50"
                    f" {r['total_p50_ms']:.3f} ms, exactly once: {r['exactly_once']}",
                    flush=True,
                )
    figures = {
        f: {
            "before": median([r[f] for r in runs["before"]]),
            "after": median([r[f] for r in runs["after"]]),
            "paired_ratio": paired_ratio(
                [r[f] for r in runs["before"]], [r[f] for r in runs["after"]]
            ),
        }
        for f in FIGURES
    }
    ok = all(r["exactly_once"] for rs in runs.values() for r in rs)
    data = {
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": info,
        "rate": rate,
        "seconds": seconds,
        "revisions": {side: commit for side, (_, commit) in sides.items()},
        "runs": runs,
        "figures": figures,
        "ok": ok,
    }
    out = write_results(data, "handoff-soak-ab")
    for f, v in figures.items():
        print(
            f"{f}: before {v['before']:.3f}, after {v['after']:.3f}"
            f" (after/before rep by rep: {v['paired_ratio']}x)"
        )
    print(f"every job started exactly once: {ok}; raw: {out}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
