"""Before/after: the same burn-down for two revisions of Deadman, interleaved.

    python -m bench.ab --base e5104d1                  # that commit vs this checkout
    python -m bench.ab --base e5104d1 --reps 6 --processes 1 --concurrency 200

Each side runs from its own tree (``git worktree`` for a commit, this checkout for
``.``) with its own migrations, in its own database of one private durable cluster;
the sides alternate rep by rep, so a busy machine slows both alike, and which side
runs first alternates too (odd reps 'before' first, even reps 'after' first): twice
the same change measured higher with its side run second than run first (DECISIONS
82), a bias one fixed order puts on one side. Each run checks
that every job succeeded exactly once, as the main suite does. The raw results go to
``bench/results/ab-<time>.json``; ``bench.report`` puts the newest one into
BENCHMARKS.md ("Before and after").
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.common import (
    create_database,
    durable_cluster,
    machine,
    median,
    remove_trees,
    revision_tree,
    write_results,
)

# Run inside the side's tree: its own bench.deadman_bench drives its own workers.
DRIVER = """
import json, sys
from pathlib import Path
from bench import deadman_bench as dm
dsn, n, p, c, logdir, setup = sys.argv[1], *map(int, sys.argv[2:5]), sys.argv[5], sys.argv[6]
if setup == "1":
    dm.setup(dsn)
else:
    r = dm.burn_down(dsn, n, p, c, Path(logdir))
    print(json.dumps({k: r[k] for k in ("jobs_per_s", "cpu_cores", "verify")}))
"""


#: the two sides of a comparison: side -> (its tree, its commit)
Sides = dict[str, tuple[Path, str]]


def side_arguments(ap: argparse.ArgumentParser) -> None:
    """--base and --rev, as every before/after tool takes them."""
    ap.add_argument("--base", required=True, help="the 'before' revision (a commit)")
    ap.add_argument("--rev", default=".", help="the 'after' revision (default: this checkout)")


@contextlib.contextmanager
def two_sides(
    base: str, rev: str, database_prefix: str
) -> Iterator[tuple[Sides, dict[str, str], dict[str, Any]]]:
    """Each side's tree (a worktree of a commit, or this checkout for '.'), a database
    for each on one private durable cluster, and the machine's description; the trees
    are removed afterwards."""
    keep: list[Path] = []
    try:
        sides = {"before": revision_tree(base, keep), "after": revision_tree(rev, keep)}
        with durable_cluster() as cluster:
            dsns = {side: create_database(cluster, f"{database_prefix}_{side}") for side in sides}
            yield sides, dsns, machine(dsns["after"])
    finally:
        remove_trees(keep)


def run_driver(tree: Path, driver: str, args: list[str]) -> dict[str, Any]:
    """Run ``driver`` (Python source) with ``args`` inside ``tree``, on that tree's own
    package; its last line of JSON is the result."""
    out = subprocess.run(
        [sys.executable, "-c", driver, *args],
        cwd=tree,
        env={**_base_env(), "PYTHONPATH": str(tree)},
        capture_output=True,
        text=True,
        timeout=900,
    )
    if out.returncode != 0:
        raise RuntimeError(f"driver in {tree} failed: {out.stderr[-2000:]}")
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    return json.loads(lines[-1]) if lines else {}


def _drive(tree: Path, args: list[str]) -> dict[str, Any]:
    return run_driver(tree, DRIVER, args)


def rep_order(rep: int) -> tuple[str, str]:
    """Which side runs first in rep ``rep`` (0-based): 'before' in even reps, 'after'
    in odd ones, so over an even number of reps each side goes first as often."""
    return ("before", "after") if rep % 2 == 0 else ("after", "before")


def paired_ratio(before: list[float], after: list[float]) -> float | None:
    """The median over reps of after ÷ before within each rep: a slow minute slows
    both runs of a rep, so it cancels here where it would not across medians."""
    ratios = [a / b for b, a in zip(before, after, strict=True) if b > 0]
    return round(median(ratios), 3) if ratios else None


def _base_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("DEADMAN_")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    side_arguments(ap)
    ap.add_argument("--processes", type=int, default=2)
    ap.add_argument("--concurrency", type=int, default=200)
    ap.add_argument("--jobs", type=int, default=20_000)
    ap.add_argument("--reps", type=int, default=4, help="even: each side first as often")
    ap.add_argument("--out", help="raw JSON path (default bench/results/ab-<time>.json)")
    a = ap.parse_args(argv)
    results: dict[str, list[dict[str, Any]]] = {"before": [], "after": []}
    with two_sides(a.base, a.rev, "ab") as (sides, dsns, info):
        logdir = Path(tempfile.mkdtemp(prefix="deadman-ab-logs-"))
        common = [str(a.jobs), str(a.processes), str(a.concurrency), str(logdir)]
        for side, (tree, _) in sides.items():
            _drive(tree, [dsns[side], *common, "1"])
        for rep in range(a.reps):
            for place, side in enumerate(rep_order(rep)):
                tree, commit = sides[side]
                r = {**_drive(tree, [dsns[side], *common, "0"]), "ran_first": place == 0}
                results[side].append(r)
                ok = (r.get("verify") or {}).get("ok")
                print(
                    f"rep {rep + 1} {side} ({commit}): {r.get('jobs_per_s')} jobs/s, "
                    f"exactly once: {ok}",
                    flush=True,
                )
    failed = [r for rs in results.values() for r in rs if not (r.get("verify") or {}).get("ok")]
    jobs_per_s = {side: [r["jobs_per_s"] for r in rs] for side, rs in results.items()}
    med = {side: median(values) for side, values in jobs_per_s.items()}
    data = {
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": info,
        "setting": {"processes": a.processes, "concurrency": a.concurrency, "jobs": a.jobs},
        "revisions": {side: commit for side, (_, commit) in sides.items()},
        "runs": results,
        "median_jobs_per_s": med,
        "ratio": round(med["after"] / med["before"], 3) if med["before"] else None,
        "paired_ratio": paired_ratio(jobs_per_s["before"], jobs_per_s["after"]),
        "ok": not failed,
    }
    out = write_results(data, "ab", a.out)
    print(
        f"median before {med['before']}, after {med['after']} jobs/s "
        f"({data['ratio']}x; rep by rep {data['paired_ratio']}x, each side first in "
        f"alternate reps); every run exactly once: {data['ok']}; raw: {out}"
    )
    return 0 if data["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
