"""What one job costs at low load: a worker (concurrency 10) on ``--database-url``,
``--rate`` single ``Client.enqueue`` calls per second for ``--seconds`` from one
thread; then CPU per job (the worker, Postgres, this sender, from /proc) and the
database's counters per job (pg_stat_database: transactions, tuples returned and
fetched, buffer hits). Bounded: ``rate * seconds`` jobs, a 60 s deadline for them to
finish. Use a freshly created, migrated database to see what a new install pays.

    .venv-bench/bin/python -m bench.low_load --database-url postgresql://... --rate 200
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psycopg

from deadman import Client

COUNTERS = (
    "xact_commit",
    "tup_returned",
    "tup_fetched",
    "tup_inserted",
    "tup_updated",
    "blks_hit",
)
STATS = f"SELECT {', '.join(COUNTERS)} FROM pg_stat_database WHERE datname = current_database()"
DONE = "SELECT count(*) FROM deadman.jobs WHERE state = 'succeeded'"


def ticks() -> dict[int, tuple[str, int]]:
    """pid -> (command, utime+stime ticks) of every process."""
    out: dict[int, tuple[str, int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        out[int(entry.name)] = (comm, int(fields[11]) + int(fields[12]))
    return out


def _count(dsn: str, query: str) -> tuple[int, ...]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(query).fetchone()
    assert row is not None
    return tuple(int(v) for v in row)


def run(dsn: str, rate: float, seconds: float) -> dict[str, float]:
    n = round(rate * seconds)
    worker = subprocess.Popen(
        [sys.executable, "-m", "deadman", "worker", "--database-url", dsn, "--concurrency", "10"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        time.sleep(3.0)  # the worker connects and makes its first claim
        done0 = _count(dsn, DONE)[0]
        stats0 = _count(dsn, STATS)
        before = ticks()
        with Client(dsn) as client:
            start = time.perf_counter()
            for i in range(n):
                wait = start + i / rate - time.perf_counter()
                if wait > 0:
                    time.sleep(wait)
                client.enqueue("noop", {"i": i})
        deadline = time.monotonic() + 60
        while _count(dsn, DONE)[0] < done0 + n:
            if time.monotonic() > deadline:
                raise SystemExit("the jobs did not finish within 60 s")
            time.sleep(0.05)
        after = ticks()
        time.sleep(1.5)  # the backends flush their statistics
        stats1 = _count(dsn, STATS)
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(30)
    hz = os.sysconf("SC_CLK_TCK")

    def cpu_ms(keep: set[int]) -> float:
        used = sum(t - before.get(p, ("", 0))[1] for p, (_, t) in after.items() if p in keep)
        return round(used / hz / n * 1e3, 3)

    postgres = {p for p, (comm, _) in after.items() if comm.startswith("postgres")}
    out = {
        "jobs": float(n),
        "worker_cpu_ms_per_job": cpu_ms({worker.pid}),
        "postgres_cpu_ms_per_job": cpu_ms(postgres),
        "sender_cpu_ms_per_job": cpu_ms({os.getpid()}),
    }
    for name, a, b in zip(COUNTERS, stats0, stats1, strict=True):
        out[f"{name}_per_job"] = round((b - a) / n, 2)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    for key, value in run(args.database_url, args.rate, args.seconds).items():
        print(f"{key:<28} {value:g}")


if __name__ == "__main__":
    main()
