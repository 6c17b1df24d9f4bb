"""One worker process's CPU per job, and the revisions' side by side.

On a fresh durable cluster of its own: ``--jobs`` jobs (no-op ones unless ``--type``
and ``--payload`` say otherwise: ``--type cpu --payload '{"iterations": 0}'`` is a
sync handler that does nothing) are queued in a paused queue, one ``deadman worker
--processes 1 --concurrency C`` starts, and once it has registered (its imports and
start-up done) the queue is resumed. The worker's CPU (``/proc``: user and system
time) is read at the resume and again when the last job has succeeded, so the figure
is the burn-down's alone, per job. ``--base REV``: the worker of that revision (a
``git worktree``) and of ``--rev`` take turns, the order rotated rep by rep, on
the one cluster, with this interpreter and its installed packages: run it with
``.venv/bin/python`` to measure a worker with OpenTelemetry's API installed (the dev
extras), with ``.venv-bench/bin/python`` without it. ``--variant NAME=DEADMAN_VAR=value``
(repeated): each revision runs under each variant's settings too.

    .venv/bin/python -m bench.worker_cpu --jobs 100000 --reps 3
    .venv/bin/python -m bench.worker_cpu --base HEAD~1 --reps 3
    .venv-bench/bin/python -m bench.worker_cpu --type side-effect --concurrency 200 \
        --variant pool16= --variant pool64=DEADMAN_HANDLER_POOL_SIZE=64

Bounded: ``--reps`` x sides x variants runs, each waiting at most ``--timeout`` seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg

from bench import common
from bench.env_ab import parse_variant, rotated
from deadman.client import Client
from deadman.db.migrate import migrate
from deadman.db.queries import QUERIES

QUEUE = "default"


def burn(
    dsn: str,
    tree: Path,
    jobs: int,
    concurrency: int,
    timeout: float,
    log: Path,
    job_type: str = "noop",
    payload: Any = None,
    env: dict[str, str] | None = None,
    app: str | None = None,
) -> dict[str, float]:
    """One burn-down by the worker of ``tree`` (``env``: more of its environment): its
    CPU µs per job and jobs/s."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("TRUNCATE deadman.jobs, deadman.attempt_log CASCADE")
        conn.execute(QUERIES["queue_set_paused"], {"name": QUEUE, "paused": True})
    with Client(dsn) as client:
        for start in range(0, jobs, 1000):
            n = min(1000, jobs - start)
            client.enqueue_many([client.job(job_type, payload) for _ in range(n)])
    argv = ["worker", "--processes", "1", "--queues", QUEUE, "--concurrency", str(concurrency)]
    argv += ["--app", app] if app else []
    worker = subprocess.Popen(
        [sys.executable, "-m", "deadman", *argv],
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        env=dict(os.environ, **(env or {}), PYTHONPATH=str(tree), DEADMAN_DATABASE_URL=dsn),
        cwd=tree,
        start_new_session=True,
    )
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:

            def registered() -> bool:
                if worker.poll() is not None:
                    raise RuntimeError(f"the worker exited with {worker.returncode}; see {log}")
                row = conn.execute(
                    "SELECT 1 FROM deadman.workers WHERE pid = %s", (worker.pid,)
                ).fetchone()
                return row is not None

            common.wait_for(registered, 60.0, "the worker registered")
            cpu0, t0 = common.process_cpu_s(worker.pid), time.monotonic()
            conn.execute(QUERIES["queue_set_paused"], {"name": QUEUE, "paused": False})

            def done() -> bool:
                if worker.poll() is not None:
                    raise RuntimeError(f"the worker exited with {worker.returncode}; see {log}")
                row = conn.execute(
                    "SELECT count(*) FROM deadman.jobs WHERE state <> 'succeeded'"
                ).fetchone()
                return row is not None and row[0] == 0

            common.wait_for(done, timeout, "every job succeeded", every=0.1)
            cpu1, t1 = common.process_cpu_s(worker.pid), time.monotonic()
            finished = conn.execute(
                "SELECT count(*) FROM deadman.jobs WHERE state = 'succeeded' AND attempt = 1"
            ).fetchone()
        if finished is None or finished[0] != jobs:
            raise AssertionError(f"{finished} jobs succeeded at their first attempt, not {jobs}")
    finally:
        common.stop(worker)
    return {"cpu_us_per_job": (cpu1 - cpu0) / jobs * 1e6, "jobs_per_s": jobs / (t1 - t0)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=100_000)
    ap.add_argument("--concurrency", type=int, default=1000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("--base", help="a git revision to compare with --rev")
    ap.add_argument("--rev", default=".", help="a git revision; '.' is this checkout")
    ap.add_argument("--type", default="noop", help="the jobs' type (a built-in handler)")
    ap.add_argument("--app", default=None, help="the worker's --app (bench.deadman_app:registry)")
    ap.add_argument("--payload", type=json.loads, default=None, help="the jobs' payload, JSON")
    ap.add_argument(
        "--variant",
        type=parse_variant,
        action="append",
        help="NAME=DEADMAN_VAR=value,...: the worker's settings (repeat; each revision"
        " runs under each); omitted: the environment as it is",
    )
    args = ap.parse_args()
    keep: list[Path] = []
    sides = [common.revision_tree(args.rev, keep)]
    if args.base:
        sides.insert(0, common.revision_tree(args.base, keep))
    variants: list[tuple[str, dict[str, str]]] = args.variant or [("", {})]
    runs = [
        (tree, f"{name} {variant}".strip(), env)
        for tree, name in sides
        for variant, env in variants
    ]
    log = Path(tempfile.mkdtemp(prefix="deadman-worker-cpu-")) / "worker.log"
    found: dict[str, list[dict[str, float]]] = {name: [] for _, name, _ in runs}
    try:
        with common.durable_cluster() as cluster:
            dsn = common.create_database(cluster, "worker_cpu")
            migrate(dsn)
            for rep in range(args.reps):
                for tree, name, env in rotated(runs, rep):
                    r = burn(
                        dsn,
                        tree,
                        args.jobs,
                        args.concurrency,
                        args.timeout,
                        log,
                        args.type,
                        args.payload,
                        env,
                        args.app,
                    )
                    found[name].append(r)
                    print(
                        f"rep {rep + 1} {name:>16}  {r['cpu_us_per_job']:5.1f} µs/job"
                        f"  {r['jobs_per_s']:8,.0f} jobs/s",
                        flush=True,
                    )
    finally:
        common.remove_trees(keep)
    for name, done in found.items():
        cpu = sorted(round(r["cpu_us_per_job"], 1) for r in done)
        rate = statistics.median(r["jobs_per_s"] for r in done)
        print(
            f"{name:>16}  worker CPU median {statistics.median(cpu):5.1f} µs/job {cpu};"
            f" median {rate:,.0f} jobs/s"
        )


if __name__ == "__main__":
    main()
