"""Retention and bloat under a steady load, with a transaction held open in the middle.

A producer enqueues ``rate`` jobs per second (``Client.enqueue_many``, COPY, 10
batches a second) into a fresh database; ``workers`` ``deadman worker`` processes
(defaults otherwise) run them, their rescuers pruning succeeded jobs older than
``retention`` seconds (``DEADMAN_RETENTION_SUCCEEDED_S``). From ``hold_start_s`` to
``hold_end_s`` a separate connection to the same database holds a transaction open
(``BEGIN; SELECT txid_current();`` then nothing until ``ROLLBACK``), which pins the
xmin horizon: vacuum may not reclaim any row deleted or updated after it began.

Every ``every`` seconds the jobs table is sampled: heap and index size, live and dead
tuples, autovacuum runs, the backlog (queued + running), jobs finished in the
interval (jobs acknowledged to the producer minus the backlog, to within one batch)
and the age of the oldest xmin in the database.

Each job is ``bench_mark`` (bench.deadman_app): its handler records the job's number
and start time, so at the end — producer stopped, backlog drained (bounded) —
every number acknowledged to the producer must have started exactly once, and no
job left in the table may be in a state other than 'succeeded'. Anything else fails.

Part of ``python -m bench.run`` (phase ``retention``); standalone, on its own cluster:

    .venv-bench/bin/python -m bench.retention --duration 600 --hold 240 360
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import json
import threading
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
from psycopg.rows import dict_row

from bench import common
from bench.deadman_bench import APP, DEFAULTS
from deadman.client import Client
from deadman.db.migrate import migrate
from deadman.store import NewJob

SAMPLE = """
SELECT pg_relation_size('deadman.jobs') AS heap_bytes,
       pg_indexes_size('deadman.jobs') AS index_bytes,
       pg_total_relation_size('deadman.jobs') AS total_bytes,
       s.n_live_tup, s.n_dead_tup, s.autovacuum_count, s.autoanalyze_count,
       (SELECT count(*) FROM deadman.jobs WHERE state IN ('queued', 'running')) AS backlog,
       (SELECT coalesce(max(age(backend_xmin)), 0) FROM pg_stat_activity
         WHERE datname = current_database()) AS oldest_xmin_age
FROM pg_stat_user_tables s WHERE s.relid = 'deadman.jobs'::regclass
"""


class Producer(threading.Thread):
    """``rate`` bench_mark jobs a second in 10 batches; bounded by ``limit`` jobs."""

    def __init__(self, dsn: str, rate: int, limit: int) -> None:
        super().__init__(daemon=True)
        self.dsn, self.rate, self.limit = dsn, rate, limit
        self.halt = threading.Event()
        self.acked = 0  # jobs whose enqueue_many returned (committed)
        self.max_lag_s = 0.0
        self.error: BaseException | None = None

    def run(self) -> None:
        per_tick = max(1, self.rate // 10)
        try:
            with Client(self.dsn) as client:
                next_at = time.monotonic()
                while not self.halt.is_set() and self.acked < self.limit:
                    now = time.time()
                    k = min(per_tick, self.limit - self.acked)
                    batch = [
                        NewJob(type="bench_mark", payload={"i": self.acked + j, "t": now})
                        for j in range(k)
                    ]
                    ids = client.enqueue_many(batch)
                    if len(ids) != k:
                        raise AssertionError(f"enqueue_many stored {len(ids)} of {k}")
                    self.acked += k
                    next_at += 0.1
                    lag = time.monotonic() - next_at
                    self.max_lag_s = max(self.max_lag_s, lag)
                    if lag < 0:
                        self.halt.wait(-lag)
        except BaseException as exc:  # surfaced by the caller
            self.error = exc


class OpenTransaction(threading.Thread):
    """BEGIN; SELECT txid_current(); idle until ``end``; ROLLBACK (times: monotonic)."""

    def __init__(self, dsn: str, start: float, end: float) -> None:
        super().__init__(daemon=True)
        self.dsn, self.start_at, self.end_at = dsn, start, end
        self.halt = threading.Event()
        self.info: dict[str, Any] = {}
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            if self.halt.wait(max(0.0, self.start_at - time.monotonic())):
                return
            # The table as the transaction opens and as it ends, whatever the sample grid.
            self.info["at_begin"] = sample(self.dsn)
            with psycopg.connect(self.dsn) as conn:  # not autocommit: the first query BEGINs
                row = conn.execute("SELECT txid_current()").fetchone()
                self.info["began_mono"] = time.monotonic()
                self.info["xid"] = int(row[0]) if row else None
                self.halt.wait(max(0.0, self.end_at - time.monotonic()))
                self.info["at_end"] = sample(self.dsn)
                conn.rollback()
                self.info["ended_mono"] = time.monotonic()
        except BaseException as exc:
            self.error = exc


def sample(dsn: str) -> dict[str, Any]:
    with psycopg.connect(dsn, autocommit=True, row_factory=dict_row) as conn:
        row = conn.execute(SAMPLE).fetchone()
    assert row is not None
    return {k: int(v or 0) for k, v in row.items()}


def run(
    dsn: str,
    *,
    duration_s: float,
    rate: int,
    retention_s: float,
    workers: int,
    every_s: float,
    hold: tuple[float, float] | None,
    workdir: Path,
    drain_timeout_s: float = 120.0,
    log: Any = print,
) -> dict[str, Any]:
    migrate(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("TRUNCATE deadman.jobs, deadman.workers RESTART IDENTITY CASCADE")
    markdir = common.clean_dir(workdir / "retention-marks")
    env = {
        **DEFAULTS,
        "DEADMAN_RETENTION_SUCCEEDED_S": str(retention_s),
        "DEADMAN_LOG_LEVEL": "warning",
        "BENCH_MARK_DIR": str(markdir),
    }
    argv = [common.PY, "-m", "deadman", "worker", "--database-url", dsn, "--app", APP]
    procs = [
        common.spawn(argv, workdir / "logs" / f"deadman-retention-{k}.log", env)
        for k in range(workers)
    ]
    producer = Producer(dsn, rate, limit=int(rate * duration_s * 1.05) + rate)
    holder: OpenTransaction | None = None
    samples: list[dict[str, Any]] = []
    try:
        common.wait_for(
            lambda: sample_count(dsn, "SELECT count(*) FROM deadman.workers") >= workers,
            60,
            f"{workers} deadman workers",
            0.1,
        )
        started = time.monotonic()
        if hold is not None:
            holder = OpenTransaction(dsn, started + hold[0], started + hold[1])
            holder.start()
        producer.start()
        prev_t, prev_finished = 0.0, 0
        next_sample = started + every_s
        while (now := time.monotonic()) < started + duration_s + 0.5:
            time.sleep(max(0.0, min(next_sample, started + duration_s) - now))
            if producer.error is not None:
                raise RuntimeError(f"producer failed: {producer.error!r}")
            acked = producer.acked
            row = sample(dsn)
            t = time.monotonic() - started
            finished = acked - row["backlog"]
            in_hold = bool(
                holder is not None
                and "began_mono" in holder.info
                and "ended_mono" not in holder.info
            )
            row.update(
                t_s=round(t, 1),
                enqueued_total=acked,
                finished_total=finished,
                finished_in_interval=finished - prev_finished,
                finished_per_s=round((finished - prev_finished) / (t - prev_t), 1),
                transaction_open=in_hold,
            )
            samples.append(row)
            prev_t, prev_finished = t, finished
            log(
                f"retention t={row['t_s']:>5.0f}s enq={acked:>7} fin/s={row['finished_per_s']:>6}"
                f" backlog={row['backlog']:>6} live={row['n_live_tup']:>7}"
                f" dead={row['n_dead_tup']:>7} heap={row['heap_bytes'] / 2**20:6.1f}MiB"
                f" idx={row['index_bytes'] / 2**20:6.1f}MiB av={row['autovacuum_count']}"
                f"{' [txn open]' if in_hold else ''}"
            )
            if t >= duration_s - 0.01:
                break
            next_sample += every_s
        producer.halt.set()
        producer.join(30)
        if producer.is_alive() or producer.error is not None:
            raise RuntimeError(f"producer did not stop cleanly: {producer.error!r}")
        produced = producer.acked
        t_drain = time.monotonic()
        common.wait_for(
            lambda: (
                len(common.read_marks(markdir)) >= produced
                and sample_count(
                    dsn, "SELECT count(*) FROM deadman.jobs WHERE state IN ('queued', 'running')"
                )
                == 0
            ),
            drain_timeout_s,
            "the backlog to drain",
            0.5,
        )
        drain_s = time.monotonic() - t_drain
        time.sleep(0.5)  # a doubled execution would show up now
    finally:
        producer.halt.set()
        if holder is not None:
            holder.halt.set()
            holder.join(10)
        for p in procs:
            common.stop(p)
    if holder is not None and holder.error is not None:
        raise RuntimeError(f"open transaction failed: {holder.error!r}")
    marks = common.read_marks(markdir)
    starts = Counter(i for i, _, _ in marks)
    missing = sum(1 for i in range(produced) if starts[i] == 0)
    doubled = sum(1 for c in starts.values() if c > 1)
    unknown = sum(1 for i in starts if not 0 <= i < produced)
    with psycopg.connect(dsn) as conn:
        states = {
            str(s): int(c)
            for s, c in conn.execute("SELECT state, count(*) FROM deadman.jobs GROUP BY 1")
        }
    not_succeeded = sum(c for s, c in states.items() if s != "succeeded")
    verify = {
        "produced": produced,
        "executions": len(marks),
        "missing": missing,
        "doubled": doubled,
        "unknown": unknown,
        "states_left": states,
        "pruned": produced - sum(states.values()),
        "ok": missing == 0 and doubled == 0 and unknown == 0 and not_succeeded == 0,
    }
    hold_info: dict[str, Any] | None = None
    if holder is not None and "began_mono" in holder.info:
        hold_info = {
            "planned_s": list(hold or ()),
            "began_s": round(holder.info["began_mono"] - started, 1),
            "ended_s": round(holder.info.get("ended_mono", time.monotonic()) - started, 1),
            "xid": holder.info.get("xid"),
            "at_begin": holder.info.get("at_begin"),
            "at_end": holder.info.get("at_end"),
        }
    # handler start - enqueue time, per sample interval: what the window does to latency
    bounds = [0.0] + [s["t_s"] for s in samples]
    lat: list[list[float]] = [[] for _ in samples]
    t0_wall = time.time() - (time.monotonic() - started)
    for _, intended, began in marks:
        k = max(0, bisect.bisect_left(bounds, began - t0_wall) - 1)
        if k < len(samples):  # started after the last sample (the drain): not counted
            lat[k].append((began - intended) * 1000)
    for s, values in zip(samples, lat, strict=True):
        values.sort()
        s["start_latency_p50_ms"] = common.pct(values, 50)
        s["start_latency_p99_ms"] = common.pct(values, 99)
    return {
        "duration_s": duration_s,
        "rate": rate,
        "retention_s": retention_s,
        "workers": workers,
        "every_s": every_s,
        "hold": hold_info,
        "producer_max_lag_s": round(producer.max_lag_s, 3),
        "drain_s": round(drain_s, 1),
        "samples": samples,
        "verify": verify,
        "ok": verify["ok"] and (hold is None or hold_info is not None),
    }


def sample_count(dsn: str, query: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(query).fetchone()
    return int(row[0]) if row else 0


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--duration", type=float, default=600.0, help="seconds of load")
    ap.add_argument("--rate", type=int, default=500, help="jobs enqueued per second")
    ap.add_argument("--retention", type=float, default=60.0, help="succeeded retention, s")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--every", type=float, default=30.0, help="seconds between samples")
    ap.add_argument(
        "--hold",
        type=float,
        nargs=2,
        metavar=("START", "END"),
        help="hold a transaction open from START to END seconds",
    )
    args = ap.parse_args()
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    work = common.ROOT / "bench" / "results" / f"retention-{stamp}"
    (work / "logs").mkdir(parents=True, exist_ok=True)
    with common.durable_cluster() as cluster:
        dsn = common.create_database(cluster, "retention")
        result = run(
            dsn,
            duration_s=args.duration,
            rate=args.rate,
            retention_s=args.retention,
            workers=args.workers,
            every_s=args.every,
            hold=(args.hold[0], args.hold[1]) if args.hold else None,
            workdir=work,
        )
        result["machine"] = common.machine(dsn)
    path = work.with_suffix(".json")
    path.write_text(json.dumps(result, indent=2, default=str))
    print(f"wrote {path}; verified: {result['verify']}")
    with contextlib.suppress(ImportError):
        from bench import plot

        print(plot.retention_sizes({"retention": result}, work))
    if not result["ok"]:
        raise SystemExit("verification failed")


if __name__ == "__main__":
    main()
