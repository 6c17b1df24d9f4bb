"""Enqueue -> start latency through PgBouncer in transaction mode, polling only.

``python -m bench.pgbouncer_latency [--quick] [--reps N] [--poll-s 1.0 0.1]``

The latency phase of bench.run (bench.deadman_bench.latency: open-loop single-job
submissions with ``Client.enqueue`` to one default worker, marks written by the
handler's first line), run on one durable cluster in these settings, interleaved:

- ``direct``: no pooler, LISTEN on (the ``deadman`` row of BENCHMARKS.md);
- ``direct_unprepared``: the same with ``DEADMAN_PREPARE=off``, which tells the cost of
  planning every statement from the cost of the pooler's hop;
- ``pgbouncer_listen_url``: worker and client through a throwaway PgBouncer in
  transaction mode (tests/pgbouncer/bouncer.py) with ``DEADMAN_PREPARE=off``, the
  worker's LISTEN straight to Postgres (``DEADMAN_LISTEN_URL``);
- ``pgbouncer_poll_<s>``: the same with ``DEADMAN_LISTEN=off``: a job is found by the
  producer's poll, every ``DEADMAN_POLL_S`` (the default 1 s, and each ``--poll-s``).

The settings reach the worker and the client through the environment (the worker
inherits it; deadman/db/pool.py reads DEADMAN_PREPARE where it makes a pool). The raw
figures go to ``bench/results/pgbouncer-latency-<time>.json``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import deadman_bench as dm
from bench.common import (
    create_database,
    durable_cluster,
    machine,
    median,
    settle,
    write_results,
)
from tests.pgbouncer import bouncer as pgb

#: the env vars a setting changes; every run starts from none of them
VARS = ("DEADMAN_PREPARE", "DEADMAN_LISTEN", "DEADMAN_LISTEN_URL", "DEADMAN_POLL_S")
#: the default poll interval (deadman.config.Settings.poll_s)
DEFAULT_POLL_S = 1.0
RATE = 200.0
SECONDS = {"full": 20.0, "quick": 5.0}


@contextmanager
def _env(values: dict[str, str]) -> Iterator[None]:
    saved = {var: os.environ.pop(var, None) for var in VARS}
    os.environ.update(values)
    try:
        yield
    finally:
        for var, value in saved.items():
            os.environ.pop(var, None)
            if value is not None:
                os.environ[var] = value


def settings(
    direct: str, bouncer: str, polls: list[float]
) -> dict[str, tuple[str, dict[str, str]]]:
    """Row name -> (the DSN worker and client use, their DEADMAN_* settings)."""
    rows: dict[str, tuple[str, dict[str, str]]] = {
        "direct": (direct, {}),
        "direct_unprepared": (direct, {"DEADMAN_PREPARE": "off"}),
        "pgbouncer_listen_url": (bouncer, {"DEADMAN_PREPARE": "off", "DEADMAN_LISTEN_URL": direct}),
    }
    for poll in polls:
        rows[f"pgbouncer_poll_{poll:g}s"] = (
            bouncer,
            {"DEADMAN_PREPARE": "off", "DEADMAN_LISTEN": "off", "DEADMAN_POLL_S": f"{poll:g}"},
        )
    return rows


KEEP: tuple[str, ...] = ("n", "ok", "missing", "doubled", "p50_ms", "p99_ms", "p999_ms")
KEEP += ("max_ms", "enqueue_call_p50_ms", "enqueue_call_p99_ms", "ack_to_start_p50_ms")
KEEP += ("ack_to_start_p99_ms",)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="5 s per run instead of 20")
    ap.add_argument("--reps", type=int, default=1, help="runs per setting (median kept)")
    ap.add_argument(
        "--poll-s",
        type=float,
        nargs="+",
        default=[DEFAULT_POLL_S, 0.1],
        help="DEADMAN_POLL_S values for the polling-only rows (default: 1 0.1)",
    )
    ap.add_argument(
        "--out", help="raw JSON path (default bench/results/pgbouncer-latency-<time>.json)"
    )
    a = ap.parse_args(argv)
    seconds = SECONDS["quick" if a.quick else "full"]
    work = Path(tempfile.mkdtemp(prefix="deadman-pgbouncer-bench-"))
    runs: dict[str, list[dict[str, Any]]] = {}
    with durable_cluster() as cluster:
        direct = create_database(cluster, "pgbouncer_latency")
        dm.setup(direct)
        info = machine(direct)
        bouncer = pgb.start(cluster.dsn())
        try:
            rows = settings(direct, bouncer.dsn(direct), a.poll_s)
            for rep in range(a.reps):
                for name, (dsn, values) in rows.items():
                    quiet = settle(direct)
                    with _env(values):
                        r = dm.latency(dsn, RATE, seconds, work / "marks", work, "sync")
                    row = {k: r.get(k) for k in KEEP} | {"settled": quiet, "env": values}
                    # a shared 2-core box: what else ran shows in the load average
                    row["loadavg_1m_after"] = round(os.getloadavg()[0], 2)
                    runs.setdefault(name, []).append(row)
                    print(
                        f"rep {rep + 1} {name}: p50 {row['p50_ms']} ms, p99 {row['p99_ms']} ms,"
                        f" ok {row['ok']}, load {row['loadavg_1m_after']}",
                        flush=True,
                    )
        finally:
            bouncer.stop()
    out_rows = {name: _median(rs) for name, rs in runs.items()}
    data = {
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": info,
        "pgbouncer": {"pool_mode": "transaction", "default_pool_size": pgb.POOL_SIZE},
        "setting": {"rate_per_s": RATE, "seconds": seconds, "reps": a.reps, "worker": "1 x 10"},
        "rows": out_rows,
        "runs": runs,
        "ok": all(r["ok"] for rs in runs.values() for r in rs),
    }
    out = write_results(data, "pgbouncer-latency", a.out)
    for name, r in out_rows.items():
        print(f"{name}: p50 {r['p50_ms']} ms, p99 {r['p99_ms']} ms, p99.9 {r['p999_ms']} ms")
    print(f"every job exactly once: {data['ok']}; raw: {out}")
    if data["ok"]:
        shutil.rmtree(work, ignore_errors=True)
    else:
        print(f"the workers' logs: {work}")
    return 0 if data["ok"] else 1


def _median(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The percentiles' medians over the runs (one run: that run)."""
    out = dict(runs[0])
    for key in ("p50_ms", "p99_ms", "p999_ms", "max_ms"):
        values = [r[key] for r in runs if r.get(key) is not None]
        out[key] = median(values) if values else None
    out["ok"] = all(r["ok"] for r in runs)
    return out


if __name__ == "__main__":
    raise SystemExit(main())
