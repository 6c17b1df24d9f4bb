"""What flow control costs the burn-down, in one run on one cluster, interleaved rep by
rep (a busy machine slows every shape alike), every run verified exactly once:

- ``unkeyed``: no-op jobs without a key, no limits defined (the baseline);
- ``unkeyed, limits elsewhere``: the same with 100 limits defined for other keys;
- ``keyed, generous limit``: every job carries a key whose limit never binds
  (concurrency 100000, 1,000,000 starts a second).

``.venv-bench/bin/python -m bench.limits_cost [--jobs 20000] [--reps 3]``; the raw JSON
goes to bench/results/limits-<time>.json. The issue asks: within 5% and 25%.
"""

from __future__ import annotations

import argparse
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg

from bench import deadman_bench as dm
from bench.common import create_database, durable_cluster, machine, median, write_results

SHAPES = ("unkeyed", "unkeyed, limits elsewhere", "keyed, generous limit")


def _limits(dsn: str, shape: str) -> str | None:
    """Set the limits of ``shape``; the key its jobs carry."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DELETE FROM deadman.limits")
        if shape == "unkeyed, limits elsewhere":
            conn.execute(
                "INSERT INTO deadman.limits (key, concurrency)"
                " SELECT 'other-' || i, 5 FROM generate_series(1, 100) AS i"
            )
        if shape == "keyed, generous limit":
            conn.execute(
                "INSERT INTO deadman.limits (key, concurrency, rate_count, rate_per_ms)"
                " VALUES ('bench', 100000, 1000000, 1000)"
            )
            return "bench"
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--processes", type=int, default=2)
    ap.add_argument("--concurrency", type=int, default=200)
    ap.add_argument("--jobs", type=int, default=20_000)
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args(argv)
    runs: dict[str, list[dict[str, Any]]] = {shape: [] for shape in SHAPES}
    with durable_cluster() as cluster:
        dsn = create_database(cluster, "limits_cost")
        dm.setup(dsn)
        info = machine(dsn)
        logdir = Path(tempfile.mkdtemp(prefix="deadman-limits-logs-"))
        for rep in range(a.reps):
            for shape in SHAPES:
                key = _limits(dsn, shape)
                r = dm.burn_down(dsn, a.jobs, a.processes, a.concurrency, logdir, limit_key=key)
                runs[shape].append(r)
                ok = r["verify"]["ok"]
                print(f"rep {rep + 1} {shape}: {r['jobs_per_s']} jobs/s, exactly once: {ok}")
    med = {shape: median([r["jobs_per_s"] for r in rs]) for shape, rs in runs.items()}
    base = med["unkeyed"]
    ratios = {shape: round(v / base, 3) for shape, v in med.items()}
    data = {
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": info,
        "setting": {"processes": a.processes, "concurrency": a.concurrency, "jobs": a.jobs},
        "runs": runs,
        "median_jobs_per_s": med,
        "ratio_to_unkeyed": ratios,
        "ok": all(r["verify"]["ok"] for rs in runs.values() for r in rs),
    }
    out = write_results(data, "limits")
    for shape in SHAPES:
        print(f"{shape}: median {med[shape]} jobs/s ({ratios[shape]}x)")
    print(f"raw: {out}")
    return 0 if data["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
