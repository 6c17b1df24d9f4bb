"""Retention and bloat under a steady load: does the jobs table stay the same size?

A producer enqueues ``--rate`` noop jobs per second (batches of COPY, 10 per second)
into a fresh database on a durable private cluster; ``--workers`` worker processes
run them, their rescuers pruning succeeded jobs older than ``--retention`` seconds.
Every ``--every`` seconds the script samples the jobs table: heap and index size,
live and dead tuples, autovacuum runs, and the backlog. With retention working the
sizes level off after the first retention period instead of growing with the total.

    .venv/bin/python -m bench.retention --duration 600 --rate 500 --retention 60

Prints a table and writes JSON under bench/results/retention-<time>.json.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
from psycopg.rows import dict_row

from bench import common
from deadman.client import Client
from deadman.config import Settings
from deadman.db.migrate import migrate
from deadman.store import NewJob

SAMPLE = """
SELECT pg_relation_size('deadman.jobs') AS heap_bytes,
       pg_indexes_size('deadman.jobs') AS index_bytes,
       pg_total_relation_size('deadman.jobs') AS total_bytes,
       s.n_live_tup, s.n_dead_tup, s.autovacuum_count, s.autoanalyze_count,
       (SELECT count(*) FROM deadman.jobs WHERE state IN ('queued', 'running')) AS backlog,
       (SELECT last_value FROM deadman.jobs_id_seq) AS enqueued_total
FROM pg_stat_user_tables s WHERE s.relid = 'deadman.jobs'::regclass
"""


def produce(dsn: str, rate: int, stop: threading.Event) -> None:
    per_tick = max(1, rate // 10)
    with Client(dsn, settings=Settings(database_url=dsn)) as client:
        next_at = time.monotonic()
        while not stop.is_set():
            client.enqueue_many([NewJob(type="noop") for _ in range(per_tick)])
            next_at += 0.1
            time.sleep(max(0.0, next_at - time.monotonic()))


def sample(dsn: str) -> dict[str, Any]:
    with psycopg.connect(dsn, autocommit=True, row_factory=dict_row) as conn:
        row = conn.execute(SAMPLE).fetchone()
    assert row is not None
    return {k: int(v or 0) for k, v in row.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration", type=float, default=600.0, help="seconds of load")
    ap.add_argument("--rate", type=int, default=500, help="jobs enqueued per second")
    ap.add_argument("--retention", type=float, default=60.0, help="succeeded retention, s")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--every", type=float, default=30.0, help="seconds between samples")
    args = ap.parse_args()

    out_dir = common.ROOT / "bench" / "results"
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    with common.durable_cluster() as cluster:
        dsn = common.create_database(cluster, "retention")
        migrate(dsn)
        env = {
            "DEADMAN_RETENTION_SUCCEEDED_S": str(args.retention),
            "DEADMAN_LOG_LEVEL": "warning",
        }
        log = Path(f"/tmp/deadman-retention-{stamp}.log")
        procs = [
            common.spawn([common.PY, "-m", "deadman", "worker", "--database-url", dsn], log, env)
            for _ in range(args.workers)
        ]
        stop = threading.Event()
        producer = threading.Thread(target=produce, args=(dsn, args.rate, stop), daemon=True)
        samples: list[dict[str, Any]] = []
        started = time.monotonic()
        producer.start()
        try:
            while (elapsed := time.monotonic() - started) < args.duration:
                time.sleep(min(args.every, max(0.0, args.duration - elapsed)))
                row = {"t_s": round(time.monotonic() - started), **sample(dsn)}
                samples.append(row)
                print(
                    f"t={row['t_s']:>4}s enqueued={row['enqueued_total']:>8} "
                    f"live={row['n_live_tup']:>7} dead_tup={row['n_dead_tup']:>6} "
                    f"heap={row['heap_bytes'] / 2**20:7.1f}MiB "
                    f"idx={row['index_bytes'] / 2**20:7.1f}MiB "
                    f"backlog={row['backlog']:>6} autovac={row['autovacuum_count']}",
                    flush=True,
                )
        finally:
            stop.set()
            producer.join(timeout=10)
            for p in procs:
                common.stop(p)
        result = {
            "args": vars(args),
            "machine": common.machine(dsn),
            "samples": samples,
        }
    path = out_dir / f"retention-{stamp}.json"
    path.write_text(json.dumps(result, indent=2, default=str))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
