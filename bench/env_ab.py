"""Settings A/B: the same burn-down of this checkout under variants of the worker's
``DEADMAN_*`` environment, interleaved rep by rep (bench.ab compares revisions; this
compares settings of one revision).

    python -m bench.env_ab --variant base= --variant c200=DEADMAN_CONCURRENCY=200
    python -m bench.env_ab --processes 2 --concurrency 500 --reps 5 \\
        --variant one=DEADMAN_COMPLETER_FLUSHES=1 --variant two=
    python -m bench.env_ab --type bench_io_100 --jobs 10000 \\
        --variant c200= --variant c1000=DEADMAN_CONCURRENCY=1000

Each variant gets its own database of one private durable cluster; the variants take
turns within each rep, so a busy machine slows them alike, and the turn order rotates
rep by rep. Each variant is reported against the first as a ratio of medians and rep
by rep (the median of each rep's own ratio; DECISIONS 82). ``--concurrency`` omitted:
the worker gets no ``--concurrency`` flag (the defaults shape), so
``DEADMAN_CONCURRENCY`` in a variant applies. ``--type``: the jobs' type, a built-in
handler or one of ``bench/deadman_app.py`` (e.g. ``bench_io_100``, which awaits 100 ms).
Every run must verify exactly once.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from pathlib import Path
from typing import Any, TypeVar

from bench import deadman_bench as dm
from bench.ab import paired_ratio
from bench.common import create_database, durable_cluster, machine

T = TypeVar("T")


def parse_variant(raw: str) -> tuple[str, dict[str, str]]:
    """``name=VAR=value,VAR=value`` (``name=`` for no change) into (name, env)."""
    name, _, rest = raw.partition("=")
    env: dict[str, str] = {}
    for item in filter(None, rest.split(",")):
        var, sep, value = item.partition("=")
        if not sep or not var.startswith("DEADMAN_"):
            raise argparse.ArgumentTypeError(f"{item!r}: expected DEADMAN_NAME=value")
        env[var] = value
    if not name:
        raise argparse.ArgumentTypeError(f"{raw!r}: a variant needs a name")
    return name, env


def rotated(names: list[T], rep: int) -> list[T]:
    """The order the variants take turns in rep ``rep`` (0-based): rotated by one each
    rep, so every variant runs first (and last) as often over ``len(names)`` reps
    (DECISIONS 82: the place in a rep's order moved a result by itself)."""
    k = rep % len(names) if names else 0
    return names[k:] + names[:k]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.env_ab", description=__doc__)
    ap.add_argument("--variant", type=parse_variant, action="append", required=True)
    ap.add_argument("--processes", type=int, default=1)
    ap.add_argument("--concurrency", type=int, help="omitted: no flag (the default)")
    ap.add_argument("--jobs", type=int, default=20_000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--type", default="noop", help="the jobs' type (default: noop)")
    ap.add_argument("--out", help="raw JSON path")
    args = ap.parse_args(argv)
    variants: dict[str, dict[str, str]] = dict(args.variant)
    if len(variants) != len(args.variant):
        ap.error("variant names must differ")
    if not 1 <= args.reps <= 20 or not 1 <= args.jobs <= 1_000_000:
        ap.error("--reps 1-20 and --jobs 1-1,000,000")
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in variants}
    logdir = Path(tempfile.mkdtemp(prefix="deadman-env-ab-"))
    box: dict[str, Any] = {}
    with durable_cluster() as cluster:
        dbs = {name: create_database(cluster, f"env_ab_{i}") for i, name in enumerate(variants)}
        for dsn in dbs.values():
            dm.setup(dsn)
        box = machine(next(iter(dbs.values())))
        for rep in range(args.reps):
            for name in rotated(list(variants), rep):
                env = variants[name]
                saved = {var: os.environ.get(var) for var in env}
                os.environ.update(env)  # the worker inherits it (bench.common.spawn)
                try:
                    r = dm.burn_down(
                        dbs[name],
                        args.jobs,
                        args.processes,
                        args.concurrency,
                        logdir,
                        job_type=args.type,
                    )
                finally:
                    for var, old in saved.items():
                        if old is None:
                            os.environ.pop(var, None)
                        else:
                            os.environ[var] = old
                if not r["verify"]["ok"]:
                    raise SystemExit(f"{name} rep {rep}: not exactly once: {r['verify']}")
                runs[name].append(
                    {
                        "jobs_per_s": r["jobs_per_s"],
                        "cpu_cores": r["cpu_cores"],
                        "cpu_us_per_job": r["cpu_us_per_job"],
                    }
                )
                us = r["cpu_us_per_job"]
                print(
                    f"{name} rep {rep}: {r['jobs_per_s']:,.0f} jobs/s, CPU µs/job "
                    f"workers {us.get('workers', 0):.0f} postgres {us.get('postgres', 0):.0f}",
                    flush=True,
                )
    summary = {
        name: {
            "env": variants[name],
            "median_jobs_per_s": round(statistics.median(x["jobs_per_s"] for x in rs)),
            "median_cpu_us_per_job": {
                kind: round(statistics.median(x["cpu_us_per_job"].get(kind, 0.0) for x in rs), 1)
                for kind in ("workers", "postgres")
            },
            "runs": rs,
        }
        for name, rs in runs.items()
    }
    base = next(iter(summary.values()))
    for name, s in summary.items():
        each = ", ".join(f"{x['jobs_per_s']:,.0f}" for x in s["runs"])
        ratio = s["median_jobs_per_s"] / base["median_jobs_per_s"]
        s["paired_ratio"] = paired_ratio(
            [x["jobs_per_s"] for x in base["runs"]], [x["jobs_per_s"] for x in s["runs"]]
        )
        us = s["median_cpu_us_per_job"]
        print(
            f"{name:<16} median {s['median_jobs_per_s']:>8,} jobs/s ({ratio:.2f}x; rep by rep "
            f"{s['paired_ratio']}x) [{each}]; "
            f"CPU µs/job workers {us['workers']:.0f} postgres {us['postgres']:.0f}"
        )
    if args.out:
        plan = {k: v for k, v in vars(args).items() if k != "variant"}
        Path(args.out).write_text(
            json.dumps({"machine": box, "plan": plan, "variants": summary}, indent=2)
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
