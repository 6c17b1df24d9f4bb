"""The pgbench batched lifecycle ceiling: jobs/s the cluster allows at the SQL level.

``pgbench`` (from the Postgres bin dir ``deadman.devdb.find_pg_bindir`` finds, the one
``initdb`` comes from) runs ``bench/pgbench_lifecycle.sql`` against a plain, logged
table of its own (``bench/pgbench_lifecycle_schema.sql``) on the run's durable cluster:
each transaction of the script inserts ``batch`` rows, claims up to ``batch`` due rows
with ``FOR UPDATE SKIP LOCKED`` and marks the claimed rows done, each statement its
own durable commit. No payload, no attempt history, no lease, no fence: what a job's
life costs at its least, so the share of it a queue reaches says how much the queue
adds. Each client count runs for ``seconds``; the best is the ceiling.

After each run the table is checked: no row finished twice, none left 'running'
(claimed and never finished); rows still queued (inserted by one client, not yet
claimed when the clock stopped) are counted and left out of the jobs.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import psycopg

from deadman.devdb import find_pg_bindir

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "pgbench_lifecycle.sql"
SCHEMA = HERE / "pgbench_lifecycle_schema.sql"

_PROCESSED = re.compile(r"number of transactions actually processed: (\d+)")
_TPS = re.compile(r"tps = ([0-9.]+) \(without initial connection time\)")
_FAILED = re.compile(r"number of failed transactions: (\d+)")


def parse_pgbench(out: str) -> dict[str, Any]:
    """The figures of pgbench's summary: transactions processed, failed (0 when the
    version does not print it), tps without the initial connection time. Raises
    ValueError naming what is missing."""
    processed, tps = _PROCESSED.search(out), _TPS.search(out)
    if processed is None or tps is None:
        missing = [n for n, m in (("transactions processed", processed), ("tps", tps)) if not m]
        raise ValueError(f"pgbench output lacks {', '.join(missing)}: {out[-500:]!r}")
    failed = _FAILED.search(out)
    return {
        "transactions": int(processed.group(1)),
        "failed": int(failed.group(1)) if failed else 0,
        "tps": float(tps.group(1)),
    }


def jobs_per_s(tps: float, transactions: int, done: int) -> float:
    """Jobs finished per second: transactions per second times jobs finished per
    transaction (a claim may take fewer than the batch when other clients hold rows)."""
    return round(tps * done / transactions, 1) if transactions else 0.0


def pgbench_path() -> Path:
    return find_pg_bindir() / "pgbench"


def check(dsn: str) -> dict[str, Any]:
    """Rows by state; no row finished twice, none left running."""
    with psycopg.connect(dsn) as conn:
        done, running, queued, twice = conn.execute(
            "SELECT count(*) FILTER (WHERE state = 'done'),"
            " count(*) FILTER (WHERE state = 'running'),"
            " count(*) FILTER (WHERE state = 'queued'),"
            " count(*) FILTER (WHERE finishes > 1) FROM bench_lifecycle"
        ).fetchone() or (0, 0, 0, 0)
    return {
        "done": int(done),
        "left_running": int(running),
        "left_queued": int(queued),
        "finished_twice": int(twice),
        "ok": running == 0 and twice == 0 and done > 0,
    }


def run_one(dsn: str, seconds: float, clients: int, batch: int) -> dict[str, Any]:
    """One pgbench run of ``clients`` connections for ``seconds`` on a fresh table."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(SCHEMA.read_text())
        conn.execute("CHECKPOINT")  # each client count starts from the same state
    threads = min(clients, os.cpu_count() or 1)
    argv = [str(pgbench_path()), "-n", "-M", "prepared", "-f", str(SCRIPT)]
    argv += ["-c", str(clients), "-j", str(threads), "-T", str(max(1, round(seconds)))]
    argv += ["-D", f"batch={batch}", dsn]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 120)
    if proc.returncode != 0:
        raise RuntimeError(f"pgbench exited {proc.returncode}: {proc.stderr[-800:]}")
    figures = parse_pgbench(proc.stdout)
    verify = check(dsn)
    ok = verify["ok"] and figures["failed"] == 0
    return {
        "clients": clients,
        "threads": threads,
        "seconds": max(1, round(seconds)),
        "batch": batch,
        **figures,
        "jobs_per_s": jobs_per_s(figures["tps"], figures["transactions"], verify["done"]),
        "verify": verify,
        "ok": ok,
    }


def run(
    dsn: str,
    *,
    seconds: float,
    clients: Sequence[int],
    batch: int,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Each client count once; the ceiling is the best verified run."""
    runs = []
    for c in clients:
        r = run_one(dsn, seconds, c, batch)
        runs.append(r)
        log(f"ceiling clients={c}: {r['jobs_per_s']} jobs/s ({r['tps']} tps) ok={r['ok']}")
    good = [r for r in runs if r["ok"]]
    best = max(good, key=lambda r: r["jobs_per_s"]) if good else None
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT version()").fetchone()
    return {
        "pgbench": str(pgbench_path()),
        "script": SCRIPT.name,
        "server": row[0] if row else "?",
        "runs": runs,
        "jobs_per_s": best["jobs_per_s"] if best else None,
        "best_clients": best["clients"] if best else None,
        "ok": len(good) == len(runs),
    }


def main(argv: list[str] | None = None) -> int:
    """The ceiling alone, on a private durable cluster (bench.run's 'ceiling' phase)."""
    from bench.common import create_database, durable_cluster

    ap = argparse.ArgumentParser(prog="python -m bench.pgbench_ceiling", description=main.__doc__)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--clients", default="2,4,8", help="comma-separated client counts")
    ap.add_argument("--batch", type=int, default=100)
    args = ap.parse_args(argv)
    try:
        clients = [int(c) for c in args.clients.split(",")]
    except ValueError:
        ap.error("--clients: comma-separated whole numbers")
    if not clients or min(clients) < 1 or args.batch < 1 or not 1 <= args.seconds <= 3600:
        ap.error("--clients and --batch at least 1, --seconds 1 to 3600")
    with durable_cluster() as cluster:
        res = run(
            create_database(cluster, "bench_pgbench"),
            seconds=args.seconds,
            clients=clients,
            batch=args.batch,
        )
    print(f"ceiling: {res['jobs_per_s']} jobs/s at {res['best_clients']} clients; ok {res['ok']}")
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
