"""Run the benchmark suite and write raw JSON, plots and BENCHMARKS.md.

    python -m bench.run            # full: 20,000 jobs, median of 3 (make bench)
    python -m bench.run --quick    # smoke: small counts, 1 rep (make bench-quick)

One private durable cluster per run (fsync on, synchronous_commit on), one fresh
database per system. Systems run one after another, never at the same time.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import deadman_bench as dm
from bench.common import (
    ROOT,
    code_fingerprint,
    commit_probe,
    create_database,
    durable_cluster,
    load,
    machine,
    median,
    reset_pg_stats,
    top_statements,
)
from bench.peers import pgqueuer_bench as pgq
from bench.peers import procrastinate_bench as pro


@dataclass(frozen=True)
class Plan:
    mode: str
    bulk_n: int
    reps: int
    burn_n: int
    deadman_grid: list[tuple[int, int]]  # (processes, concurrency)
    pgqueuer_grid: list[tuple[int, int]]  # (processes, batch_size)
    procrastinate_grid: list[tuple[int, int]]  # (processes, concurrency)
    # procrastinate burns down at ~100-500 jobs/s here, so it gets fewer jobs to keep
    # `make bench` bounded; the report says so next to its numbers.
    procrastinate_n: int
    rate: float
    latency_s: float
    rescue_n: int
    profile: tuple[int, int]


QUICK = Plan(
    mode="quick",
    bulk_n=5_000,
    reps=1,
    burn_n=5_000,
    deadman_grid=[(1, 50), (2, 50)],
    pgqueuer_grid=[(1, 10)],
    procrastinate_grid=[(1, 10)],
    procrastinate_n=2_000,
    rate=200,
    latency_s=5,
    rescue_n=10,
    profile=(1, 50),
)
FULL = Plan(
    mode="full",
    bulk_n=20_000,
    reps=3,
    burn_n=20_000,
    deadman_grid=[(p, c) for p in (1, 2) for c in (10, 50, 200)],
    pgqueuer_grid=[(1, 10), (1, 100), (2, 100)],
    procrastinate_grid=[(1, 10), (2, 50)],
    procrastinate_n=5_000,
    rate=200,
    latency_s=20,
    rescue_n=100,
    profile=(1, 200),
)


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def guarded(what: str, fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """A benchmark that crashes is recorded as a failure, and the suite goes on."""
    try:
        return fn()
    except Exception as exc:
        traceback.print_exc()
        return {"ok": False, "error": f"{what}: {exc!r}"}


BULK_PATHS = {
    "deadman": "Client.enqueue_many (COPY into a staging table, one INSERT ... SELECT)",
    "pgqueuer": "Queries.enqueue with lists (one UNNEST insert)",
    "procrastinate": "Task.batch_defer_async (one statement)",
}
MODULES: dict[str, Any] = {"deadman": dm, "pgqueuer": pgq, "procrastinate": pro}


def bulk(plan: Plan, dsns: dict[str, str]) -> dict[str, Any]:
    """Reps interleaved across systems (A B C A B C ...): this machine's commit latency
    drifts, and interleaving spreads a slow spell over every system alike."""
    secs: dict[str, list[float]] = {name: [] for name in MODULES}
    errors: dict[str, str] = {}
    reset_pg_stats(dsns["deadman"])  # resets every database's statements
    for _ in range(plan.reps):
        for name, mod in MODULES.items():
            if name in errors:
                continue
            try:
                secs[name].append(mod.bulk_enqueue(dsns[name], plan.bulk_n))
            except Exception as exc:
                traceback.print_exc()
                errors[name] = f"{name} bulk: {exc!r}"
    out: dict[str, Any] = {}
    for name in MODULES:
        if name in errors:
            out[name] = {"ok": False, "error": errors[name]}
            continue
        out[name] = {
            "path": BULK_PATHS[name],
            "n": plan.bulk_n,
            "seconds": [round(x, 4) for x in secs[name]],
            "jobs_per_s": round(plan.bulk_n / median(secs[name]), 1),
            "ok": True,
            "top_statements": top_statements(dsns[name], 4),
        }
        log(f"bulk {name}: {out[name]['jobs_per_s']} jobs/s {out[name]['seconds']}")
    return out


def _median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    ok = all(r.get("verify", {}).get("ok") for r in runs)
    mid = sorted(runs, key=lambda r: r["jobs_per_s"])[len(runs) // 2]
    return {**mid, "ok": ok, "reps": [r["jobs_per_s"] for r in runs], "runs": runs}


def burn(plan: Plan, dsns: dict[str, str], logdir: Path, ready: Path) -> dict[str, Any]:
    """Every setting of every system once per rep, reps interleaved (see bulk)."""
    cases: list[tuple[str, int, int, Callable[[], dict[str, Any]]]] = []
    for p, c in plan.deadman_grid:
        cases.append(
            (
                "deadman",
                p,
                c,
                lambda p=p, c=c: dm.burn_down(dsns["deadman"], plan.burn_n, p, c, logdir),
            )
        )
    for p, b in plan.pgqueuer_grid:
        cases.append(
            (
                "pgqueuer",
                p,
                b,
                lambda p=p, b=b: pgq.burn_down(dsns["pgqueuer"], plan.burn_n, p, b, logdir, ready),
            )
        )
    for p, c in plan.procrastinate_grid:
        cases.append(
            (
                "procrastinate",
                p,
                c,
                lambda p=p, c=c: pro.burn_down(
                    dsns["procrastinate"], plan.procrastinate_n, p, c, logdir, ready
                ),
            )
        )
    runs: dict[int, list[dict[str, Any]]] = {k: [] for k in range(len(cases))}
    errors: dict[int, str] = {}
    for rep in range(plan.reps):
        for k, (name, p, x, fn) in enumerate(cases):
            if k in errors:
                continue
            try:
                r = fn()
                runs[k].append(r)
                log(
                    f"burn rep {rep + 1} {name} P={p} {x}: {r['jobs_per_s']} jobs/s "
                    f"verified={r['verify']['ok']}"
                )
            except Exception as exc:
                traceback.print_exc()
                errors[k] = f"{name} P={p} {x}: {exc!r}"
    out: dict[str, Any] = {"deadman": [], "pgqueuer": [], "procrastinate": []}
    for k, (name, p, x, _) in enumerate(cases):
        res: dict[str, Any] = _median_run(runs[k]) if runs[k] else {"processes": p}
        if k in errors:  # the reps before the failure stay visible, the setting fails
            res.update(ok=False, error=errors[k])
        if name == "deadman":
            res.setdefault("concurrency", x)
        else:
            label = "batch_size" if name == "pgqueuer" else "concurrency"
            res.setdefault("setting", f"{p} proc, {label}={x}")
        out[name].append(res)
    best = max(
        (r for r in out["deadman"] if r.get("ok")), key=lambda r: r["jobs_per_s"], default=None
    )
    if best is not None:
        p, c = best["processes"], best["concurrency"]
        res = guarded(
            f"deadman async worker commit P={p} C={c}",
            lambda: _median_run(
                [
                    dm.burn_down(
                        dsns["deadman"], plan.burn_n, p, c, logdir, async_worker_commit=True
                    )
                    for _ in range(plan.reps)
                ]
            ),
        )
        out["deadman_async_worker_commit"] = res
        log(f"burn deadman async-commit what-if P={p} C={c}: {res.get('reps')} ok={res['ok']}")
    return out


def latency(plan: Plan, dsns: dict[str, str], work: Path, logdir: Path) -> dict[str, Any]:
    marks, ready = work / "marks", work / "ready"
    out = {
        "deadman": guarded(
            "deadman latency",
            lambda: dm.latency(dsns["deadman"], plan.rate, plan.latency_s, marks, logdir),
        ),
        "pgqueuer": guarded(
            "pgqueuer latency",
            lambda: pgq.latency(dsns["pgqueuer"], plan.rate, plan.latency_s, marks, logdir, ready),
        ),
        "procrastinate": guarded(
            "procrastinate latency",
            lambda: pro.latency(
                dsns["procrastinate"], plan.rate, plan.latency_s, marks, logdir, ready
            ),
        ),
    }
    out["deadman"]["setting"] = "1 worker process, concurrency 10 (default), Client.enqueue"
    out["pgqueuer"]["setting"] = "1 QueueManager, batch_size 10 (default), Queries.enqueue"
    out["procrastinate"]["setting"] = "1 worker, concurrency 10, Task.defer_async"
    for name, r in out.items():
        log(f"latency {name}: p50 {r.get('p50_ms')} p99 {r.get('p99_ms')} ok={r.get('ok')}")
    return out


def profile(plan: Plan, dsn: str, work: Path, logdir: Path) -> dict[str, Any]:
    raw = work / "deadman-profile.txt"
    p, c = plan.profile

    def run() -> dict[str, Any]:
        res = dm.burn_down(dsn, plan.burn_n, p, c, logdir, profile=raw)
        res["profile"] = dm.summarize_profile(raw) if raw.exists() else {"samples": 0}
        res["ok"] = res["verify"]["ok"]
        return res

    out = guarded("deadman profile", run)
    log(f"profile: {out.get('jobs_per_s')} jobs/s under py-spy")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.run")
    ap.add_argument("--quick", action="store_true", help="small counts, 1 rep (< 3 min)")
    ap.add_argument("--out", help="raw JSON path (default bench/results/<mode>-<time>.json)")
    ap.add_argument(
        "--only",
        default="bulk,burn,latency,rescue,profile",
        help="comma-separated subset of bulk,burn,latency,rescue,profile",
    )
    args = ap.parse_args(argv)
    plan = QUICK if args.quick else FULL
    only = set(args.only.split(","))
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    results_dir = ROOT / "bench" / "results"
    work = results_dir / f"{plan.mode}-{stamp}"
    logdir = work / "logs"
    logdir.mkdir(parents=True, exist_ok=True)
    out_path = Path(args.out) if args.out else results_dir / f"{plan.mode}-{stamp}.json"
    started = time.monotonic()
    data: dict[str, Any] = {
        "plan": asdict(plan),
        "started_at": stamp,
        "load_start": load(),
        "code_start": code_fingerprint(),
        "git_head": _git_head(),
    }
    with durable_cluster() as cluster:
        dsns = {
            name: create_database(cluster, f"bench_{name}")
            for name in ("deadman", "pgqueuer", "procrastinate")
        }
        dm.setup(dsns["deadman"])
        pgq.setup(dsns["pgqueuer"])
        pro.setup(dsns["procrastinate"])
        data["machine"] = machine(dsns["deadman"])
        data["machine"]["commit_probe"] = commit_probe(dsns["deadman"])
        data["versions"] = _versions()
        log(f"cluster up: {data['machine']['postgres']} {data['machine']['pg_settings']}")
        if "bulk" in only:
            data["bulk"] = bulk(plan, dsns)
        if "burn" in only:
            data["burn"] = burn(plan, dsns, logdir, work / "ready")
        if "latency" in only:
            data["latency"] = latency(plan, dsns, work, logdir)
        if "rescue" in only:
            data["rescue"] = guarded(
                "rescue", lambda: dm.rescue(dsns["deadman"], plan.rescue_n, work / "marks", logdir)
            )
            log(f"rescue: {data['rescue']}")
        if "profile" in only:
            data["profile"] = profile(plan, dsns["deadman"], work, logdir)
    data["wall_s"] = round(time.monotonic() - started, 1)
    data["load_end"] = load()
    data["code_end"] = code_fingerprint()
    out_path.write_text(json.dumps(data, indent=2, default=str))
    log(f"raw results: {out_path} ({data['wall_s']} s)")

    from bench import report

    if plan.mode == "full":
        md, plots = ROOT / "BENCHMARKS.md", ROOT / "bench" / "plots"
    else:
        md, plots = work / "BENCHMARKS.md", work / "plots"
    report.write(data, md, plots)
    log(f"wrote {md} and plots in {plots}")
    failures = _failures(data)
    for f in failures:
        log(f"FAILED: {f}")
    return 1 if failures else 0


def _failures(data: dict[str, Any]) -> list[str]:
    bad = []
    for section in ("bulk", "latency"):
        for name, r in data.get(section, {}).items():
            if not r.get("ok"):
                bad.append(f"{section} {name}: {r.get('error') or r.get('verify')}")
    for name, runs in data.get("burn", {}).items():
        for r in runs if isinstance(runs, list) else [runs]:
            if not r.get("ok"):
                bad.append(
                    f"burn {name} {r.get('setting') or r.get('concurrency')}: "
                    f"{r.get('error') or 'verification failed'}"
                )
    for section in ("rescue", "profile"):
        if section in data and not data[section].get("ok"):
            bad.append(f"{section}: {data[section].get('error') or 'verification failed'}")
    return bad


def _git_head() -> str:
    import subprocess

    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "deadman", "migrations"],
            cwd=ROOT,
            capture_output=True,
            text=True,
        ).stdout.strip()
    except OSError:
        return "?"
    return head + (" + uncommitted changes" if dirty else "")


def _versions() -> dict[str, str]:
    from importlib.metadata import version

    out = {"python": sys.version.split()[0]}
    for pkg in ("deadman", "pgqueuer", "procrastinate", "psycopg", "asyncpg"):
        try:
            out[pkg] = version(pkg)
        except Exception:
            out[pkg] = "?"
    return out


if __name__ == "__main__":
    sys.exit(main())
