"""What one job costs at low load: a worker (concurrency 10) on ``--database-url``,
``--rate`` single ``Client.enqueue`` calls per second for ``--seconds`` from one
thread; then CPU per job (the worker, Postgres, this sender: bench.common.cpu_used)
and the database's counters per job (pg_stat_database: transactions, tuples returned
and fetched, buffer hits). Bounded: ``rate * seconds`` jobs, a 60 s deadline for them to
finish. Use a freshly created, migrated database to see what a new install pays.

    .venv-bench/bin/python -m bench.low_load --database-url postgresql://... --rate 200
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import time
from pathlib import Path

import psycopg

from bench import common
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


def _watch_postmaster(dsn: str) -> None:
    """Count this database's server processes as 'postgres' in common.cpu_snapshot:
    its postmaster is the parent of our backend (the server is on this machine)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT pg_backend_pid()").fetchone()
    assert row is not None
    stat = Path(f"/proc/{int(row[0])}/stat").read_text()
    common.POSTMASTER[:] = [int(stat[stat.rindex(")") + 2 :].split()[1])]


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
        _watch_postmaster(dsn)
        before = common.cpu_snapshot([worker.pid])
        started = time.monotonic()
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
        window_s = time.monotonic() - started
        cores = common.cpu_used(before, window_s, [worker.pid])
        time.sleep(1.5)  # the backends flush their statistics
        stats1 = _count(dsn, STATS)
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(30)

    def cpu_ms(kind: str) -> float:
        return round(cores.get(kind, 0.0) * window_s / n * 1e3, 3)

    out = {
        "jobs": float(n),
        "worker_cpu_ms_per_job": cpu_ms("workers"),
        "postgres_cpu_ms_per_job": cpu_ms("postgres"),
        "sender_cpu_ms_per_job": cpu_ms("bench"),
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
