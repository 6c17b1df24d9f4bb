"""A burst into an empty queue: Deadman against pgqueuer at their best settings.

    python -m bench.burst                       # 200,000 jobs, 4 reps
    python -m bench.burst --jobs 500000 --reps 2

``make bench``'s burn-down commits 20,000 jobs at once (a rep lasts under a second at
the best setting). Here the same burn-down is run with a burst ten times that size,
as a nightly batch or a backlog after an outage arrives: each rep empties the
system's tables (and analyzes them empty, as ``make bench`` does), starts its workers
idle, commits ``--jobs`` no-op jobs in one bulk call and times from that commit to the
last job's completion as the database recorded it. Deadman runs ``deadman worker
--processes 2 --concurrency 1000``, pgqueuer 2 processes with batch_size 1000: each
one's best setting in the last ``make bench`` (its wider grids, DECISIONS 95). The two
take turns rep by rep on one private durable cluster, which goes first alternating
(as ``bench.ab``), and every run is verified exactly once by each system's own check.
Reported per rep, not only as medians: the first reps after the tables were emptied
are the point. procrastinate is left out (a few hundred jobs/s here: a burst this size
would take it many minutes).
Raw results: ``bench/results/burst-<time>.json``.
"""

from __future__ import annotations

import argparse
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import deadman_bench as dm
from bench.ab import paired_ratio, rep_order
from bench.common import create_database, durable_cluster, machine, median, write_results
from bench.peers import pgqueuer_bench as pq

SIDES = ("deadman", "pgqueuer")
#: bench.ab's names for the two sides: the ratios are Deadman ÷ pgqueuer
AB_NAME = {"before": "pgqueuer", "after": "deadman"}


def run_one(side: str, dsn: str, n: int, logdir: Path) -> dict[str, Any]:
    """One burn-down of ``n`` jobs by ``side`` at its best setting."""
    if side == "deadman":
        return dm.burn_down(dsn, n, 2, 1000, logdir)
    return pq.burn_down(dsn, n, 2, 1000, logdir, logdir / "ready")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=200_000)
    ap.add_argument("--reps", type=int, default=4, help="even: each side first as often")
    ap.add_argument("--out", help="raw JSON path (default bench/results/burst-<time>.json)")
    a = ap.parse_args(argv)
    runs: dict[str, list[dict[str, Any]]] = {side: [] for side in SIDES}
    logdir = Path(tempfile.mkdtemp(prefix="deadman-burst-"))
    with durable_cluster() as cluster:
        dsns = {side: create_database(cluster, f"burst_{side}") for side in SIDES}
        dm.setup(dsns["deadman"])
        pq.setup(dsns["pgqueuer"])
        info = machine(dsns["deadman"])
        for rep in range(a.reps):
            for side in (AB_NAME[name] for name in rep_order(rep)):
                r = run_one(side, dsns[side], a.jobs, logdir) | {"rep": rep + 1}
                runs[side].append(r)
                print(
                    f"rep {rep + 1} {side}: {r['jobs_per_s']} jobs/s, CPU µs per job"
                    f" {r['cpu_us_per_job']}, exactly once: {r['verify'].get('ok')}",
                    flush=True,
                )
    rates = {side: [r["jobs_per_s"] for r in rs] for side, rs in runs.items()}
    ok = all(r["verify"].get("ok") for rs in runs.values() for r in rs)
    data = {
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": info,
        "jobs": a.jobs,
        "settings": {"deadman": "2 processes x 1000 slots", "pgqueuer": "2 proc, batch_size=1000"},
        "runs": runs,
        "median_jobs_per_s": {side: median(v) for side, v in rates.items()},
        "deadman_over_pgqueuer_rep_by_rep": [
            round(d / p, 2) for d, p in zip(rates["deadman"], rates["pgqueuer"], strict=True)
        ],
        "paired_ratio": paired_ratio(rates["pgqueuer"], rates["deadman"]),
        "ok": ok,
    }
    out = write_results(data, "burst", a.out)
    print(
        f"median deadman {data['median_jobs_per_s']['deadman']}, pgqueuer"
        f" {data['median_jobs_per_s']['pgqueuer']} jobs/s; deadman / pgqueuer rep by rep"
        f" {data['deadman_over_pgqueuer_rep_by_rep']} (median {data['paired_ratio']}x);"
        f" every run exactly once: {ok}; raw: {out}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
