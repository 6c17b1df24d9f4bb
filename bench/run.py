"""Run the benchmark suite and write raw JSON, plots and BENCHMARKS.md.

    python -m bench.run            # full: 20,000 jobs, median of 3, issue 16's shapes
                                   # (defaults, concurrency 1 and 8, bulk in 1,000-job
                                   # calls, the pgbench ceiling), 1M-job scale, 10-minute
                                   # retention run (make bench: 58 min on 2 cores)
    python -m bench.run --quick    # smoke: small counts, 1 rep, every phase (make
                                   # bench-quick, ~7 min on a busy 2-core machine)
    python -m bench.run --only http,scale   # a subset of the phases
    python -m bench.run --only latency      # the latency phase alone (~7 min): its JSON,
                                            # full-latency-<time>.json, gets its own
                                            # section in BENCHMARKS.md (bench.report)

One private durable cluster per run (fsync on, synchronous_commit on), one fresh
database per system. Systems run one after another, never at the same time.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import deadman
from bench import deadman_bench as dm
from bench import http_submit, pgbench_ceiling, retention, scale
from bench.common import (
    IO_WAITS_MS,
    ROOT,
    code_fingerprint,
    commit_probe,
    cpu_share,
    create_database,
    durable_cluster,
    io_name,
    load,
    machine,
    median,
    remove_trees,
    reset_pg_stats,
    revision_tree,
    settle,
    share_snapshot,
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
    http_s: float  # seconds per HTTP mode and round
    http_clients: int
    scale_n: int  # jobs queued, then completed, for the scale points
    scale_samples: int  # timed claims per point
    scale_run_timeout_s: float  # bound on running the scale_n jobs
    retention_duration_s: float
    retention_rate: int
    retention_keep_s: float  # DEADMAN_RETENTION_SUCCEEDED_S
    retention_workers: int
    retention_every_s: float
    retention_hold: tuple[float, float]  # transaction held open from, to (s)
    # Issue 16's shapes: one process per system, at each system's defaults and at
    # these concurrencies (Deadman --concurrency, pgqueuer's entrypoint
    # concurrency_limit, procrastinate's concurrency); burn_n jobs (procrastinate_n).
    shape_concurrency: tuple[int, ...] = (1, 8)
    shape_n: int = 20_000  # jobs per shape run (procrastinate: at most procrastinate_n)
    # pgqueuer under an entrypoint concurrency_limit dispatches at most the limit per
    # dequeue round, and waits its 0.1 s poll between rounds when at the limit
    # (measured: ~10 jobs/s per slot), so it gets this many jobs per slot instead.
    pgqueuer_limited_n_per_slot: int = 250
    # The io phase's handlers wait (bench.common.IO_WAITS_MS): a run gets at most the
    # jobs its slots finish in this many seconds of waiting alone (a system's default
    # concurrency where the shape sets none; pgqueuer's default is unlimited, so its
    # runs there get shape_n), so that a run at concurrency 1 stays short.
    io_run_s: float = 3.0
    bulk_per_call: int = 1_000  # bulk_n jobs again, in calls of this many
    ceiling_s: float = 10.0  # seconds per pgbench run
    ceiling_clients: tuple[int, ...] = (2, 4, 8)
    ceiling_batch: int = 100  # jobs per insert, claim and finish in the pgbench script
    # rounds of every HTTP mode (each mode's figure is its median round): one 10 s
    # round per mode read keyed from 64 clients at 7,316, 5,714 and 6,583 in three
    # runs of the same server code
    http_reps: int = 3


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
    http_s=2,
    http_clients=8,
    scale_n=20_000,
    scale_samples=200,
    scale_run_timeout_s=120,
    retention_duration_s=60,
    retention_rate=500,
    retention_keep_s=15,
    retention_workers=2,
    retention_every_s=5,
    retention_hold=(20, 40),
    shape_n=1_000,
    pgqueuer_limited_n_per_slot=25,
    io_run_s=0.5,
    ceiling_s=3.0,
    ceiling_clients=(4,),
    http_reps=1,
)
FULL = Plan(
    mode="full",
    bulk_n=20_000,
    reps=3,
    burn_n=20_000,
    # Both grids go past where each system's throughput stopped rising in a wider
    # scratch sweep (DECISIONS 95): Deadman to 2,000 slots, pgqueuer to batches of
    # 3,000 (its best there was 2 x 1,000; 2 x 100 was the old grid's edge).
    deadman_grid=[(p, c) for p in (1, 2) for c in (10, 50, 200, 500, 1000, 2000)],
    pgqueuer_grid=[(1, 10), (1, 100), (2, 100), (2, 300), (2, 1000), (2, 3000)],
    procrastinate_grid=[(1, 10), (2, 50)],
    procrastinate_n=5_000,
    rate=200,
    latency_s=20,
    rescue_n=100,
    profile=(1, 200),
    http_s=10,
    http_clients=8,
    scale_n=1_000_000,
    scale_samples=1_000,
    scale_run_timeout_s=900,
    retention_duration_s=600,
    retention_rate=500,
    retention_keep_s=60,
    retention_workers=2,
    retention_every_s=30,
    retention_hold=(240, 360),
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
    "deadman": "Client.enqueue_many (COPY straight into deadman.jobs under reserved ids)",
    "pgqueuer": "Queries.enqueue with lists (one UNNEST insert)",
    "procrastinate": "Task.batch_defer_async (one statement)",
}
#: The keyed bulk shape: a key of its own per job, a taken one skipped. procrastinate
#: is not in it: its queueing_lock is set per deferring call, not per job of a batch.
KEYED_BULK_PATHS = {
    "deadman": "Client.enqueue_many, an idempotency key per job (COPY straight in under"
    " a savepoint; DECISIONS 92)",
    "pgqueuer": "Queries.enqueue with lists, a dedupe_key per job, on_conflict='skip'",
}
MODULES: dict[str, Any] = {"deadman": dm, "pgqueuer": pgq, "procrastinate": pro}


def bulk(plan: Plan, dsns: dict[str, str]) -> dict[str, Any]:
    """Reps interleaved across systems (A B C A B C ...): this machine's commit latency
    drifts, and interleaving spreads a slow spell over every system alike. Each rep
    runs every system twice: ``bulk_n`` jobs in one call (``out[name]``), then in
    calls of ``bulk_per_call`` (``out["in_calls"][name]``), every call timed; then,
    for the systems of KEYED_BULK_PATHS, in calls of ``bulk_per_call`` with a key of
    its own per job (``out["keyed"][name]``)."""
    sizes = {"one": None, "calls": plan.bulk_per_call, "keyed": plan.bulk_per_call}
    kinds = [(n, k) for n in MODULES for k in sizes if k != "keyed" or n in KEYED_BULK_PATHS]
    secs: dict[tuple[str, str], list[float]] = {nk: [] for nk in kinds}
    errors: dict[tuple[str, str], str] = {}
    reset_pg_stats(dsns["deadman"])  # resets every database's statements
    for _ in range(plan.reps):
        for name, kind in kinds:
            if (name, kind) in errors:
                continue
            enqueue = MODULES[name].bulk_enqueue
            args = (dsns[name], plan.bulk_n, sizes[kind])
            try:
                took = enqueue(*args, keyed=True) if kind == "keyed" else enqueue(*args)
                secs[(name, kind)].append(took)
            except Exception as exc:
                traceback.print_exc()
                errors[(name, kind)] = f"{name} bulk ({kind}): {exc!r}"
    out: dict[str, Any] = {"in_calls": {}, "keyed": {}}
    for name, kind in kinds:
        key = (name, kind)
        if key in errors:
            res: dict[str, Any] = {"ok": False, "error": errors[key]}
        else:
            res = {
                "path": (KEYED_BULK_PATHS if kind == "keyed" else BULK_PATHS)[name],
                "n": plan.bulk_n,
                "per_call": sizes[kind] or plan.bulk_n,
                "seconds": [round(x, 4) for x in secs[key]],
                "jobs_per_s": round(plan.bulk_n / median(secs[key]), 1),
                "ok": True,
            }
            log(f"bulk {name} ({kind}): {res['jobs_per_s']} jobs/s {res['seconds']}")
        if kind == "one":
            out[name] = res
        else:
            out["in_calls" if kind == "calls" else "keyed"][name] = res
    for name in MODULES:
        if out[name].get("ok"):  # every shape's statements, over all reps
            out[name]["top_statements"] = top_statements(dsns[name], 4)
    return out


def _median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    ok = all(r.get("verify", {}).get("ok") for r in runs)
    mid = sorted(runs, key=lambda r: r["jobs_per_s"])[len(runs) // 2]
    return {**mid, "ok": ok, "reps": [r["jobs_per_s"] for r in runs], "runs": runs}


def interleaved(
    reps: int, cases: list[tuple[str, Callable[[], dict[str, Any]]]]
) -> list[dict[str, Any]]:
    """Every case once per rep, reps interleaved (A B C A B C ...; see bulk); per case
    the median run (``_median_run``), or ``{"ok": False, "error": ...}`` with the reps
    before a failure kept. A case that fails is not run again."""
    runs: dict[int, list[dict[str, Any]]] = {k: [] for k in range(len(cases))}
    errors: dict[int, str] = {}
    for rep in range(reps):
        for k, (label, fn) in enumerate(cases):
            if k in errors:
                continue
            try:
                r = fn()
                runs[k].append(r)
                log(
                    f"burn rep {rep + 1} {label}: {r['jobs_per_s']} jobs/s "
                    f"verified={r['verify']['ok']}"
                )
            except Exception as exc:
                traceback.print_exc()
                errors[k] = f"{label}: {exc!r}"
    out = []
    for k in range(len(cases)):
        res: dict[str, Any] = _median_run(runs[k]) if runs[k] else {}
        if k in errors:  # the reps before the failure stay visible, the setting fails
            res.update(ok=False, error=errors[k])
        out.append(res)
    return out


def burn(plan: Plan, dsns: dict[str, str], logdir: Path, ready: Path) -> dict[str, Any]:
    """Every setting of every system once per rep, reps interleaved (see bulk)."""
    cases: list[tuple[str, int, int, Callable[[], dict[str, Any]]]] = []
    for p, c in plan.deadman_grid:
        cases.append(
            (
                "deadman",
                p,
                c,
                partial(dm.burn_down, dsns["deadman"], plan.burn_n, p, c, logdir),
            )
        )
    for p, b in plan.pgqueuer_grid:
        cases.append(
            (
                "pgqueuer",
                p,
                b,
                partial(pgq.burn_down, dsns["pgqueuer"], plan.burn_n, p, b, logdir, ready),
            )
        )
    for p, c in plan.procrastinate_grid:
        cases.append(
            (
                "procrastinate",
                p,
                c,
                partial(
                    pro.burn_down, dsns["procrastinate"], plan.procrastinate_n, p, c, logdir, ready
                ),
            )
        )
    results = interleaved(plan.reps, [(f"{name} P={p} {x}", fn) for name, p, x, fn in cases])
    out: dict[str, Any] = {"deadman": [], "pgqueuer": [], "procrastinate": []}
    for (name, p, x, _), res in zip(cases, results, strict=True):
        res.setdefault("processes", p)
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


SHAPE_SYSTEMS = ("deadman", "pgqueuer", "procrastinate")


def shape_names(plan: Plan) -> list[tuple[str, int | None]]:
    """('defaults', None), then ('concurrency_N', N) for each of the plan's."""
    return [("defaults", None), *((f"concurrency_{c}", c) for c in plan.shape_concurrency)]


@dataclass(frozen=True)
class Noops:
    """The handler each system's burn-down shapes run: Deadman's job type and payload,
    pgqueuer's entrypoint, procrastinate's task."""

    deadman: tuple[str, Any]
    pgqueuer: str
    procrastinate: str
    #: more Deadman rows, each under a name of its own: (name, (job type, payload))
    deadman_also: tuple[tuple[str, tuple[str, Any]], ...] = ()
    #: the handlers wait this long (ms) and so each run is bounded by plan.io_run_s
    wait_ms: int | None = None


ASYNC_NOOPS = Noops(("noop", None), "noop", "noop")
#: The sync phase's handlers: each system's no-op run in a thread, the way its
#: documentation says a blocking handler runs (Deadman: a plain ``def`` handler, the
#: built-in ``cpu`` with no iterations; pgqueuer: an async entrypoint awaiting
#: ``asyncio.to_thread``, since it refuses sync entrypoints; procrastinate: a plain
#: ``def`` task).
SYNC_HANDLERS = Noops(("cpu", {"iterations": 0}), pgq.SYNC_ENTRYPOINT, pro.SYNC_TASK)
#: The effects phase's handlers: each writes one row per job into a table of the
#: system's database. Deadman in ``ctx.transaction()``, with the job's completion, so
#: exactly once (bench.deadman_app ``bench_effect``); the peers one INSERT committed
#: on its own on a pool of 16 connections, at least once, since neither can commit a
#: write with its completion; and Deadman again that peers' way
#: (``bench_effect_plain``, row ``deadman_plain``), to show what the guarantee costs.
EFFECT_HANDLERS = Noops(
    ("bench_effect", None),
    pgq.EFFECT_ENTRYPOINT,
    pro.EFFECT_TASK,
    deadman_also=(("deadman_plain", ("bench_effect_plain", None)),),
)


def io_handlers(ms: int) -> Noops:
    """The io phase's handlers for one wait: each system's handler awaits ``ms`` and
    returns (bench.deadman_app ``bench_io_<ms>``; pgqueuer's entrypoint and
    procrastinate's task ``io_<ms>``), as a handler that calls another service does."""
    name = io_name(ms)
    return Noops((f"bench_{name}", None), name, name, wait_ms=ms)


def _jobs(plan: Plan, noops: Noops, n: int, slots: int | None) -> int:
    """A run's jobs: ``n``, or with waiting handlers at most what ``slots`` (None:
    unlimited) finish in ``plan.io_run_s`` of waiting."""
    if noops.wait_ms is None or slots is None:
        return n
    return min(n, max(1, slots * round(plan.io_run_s * 1000 / noops.wait_ms)))


def shapes(
    plan: Plan,
    dsns: dict[str, str],
    logdir: Path,
    ready: Path,
    noops: Noops = ASYNC_NOOPS,
) -> dict[str, Any]:
    """Issue 16's shapes, one process each: every system at its library defaults (no
    concurrency option at all: Deadman's from ``Settings``, whatever this revision
    says), then at each of ``plan.shape_concurrency``; every case once per rep, reps
    interleaved, every run verified exactly once. ``out[shape][system]``. ``noops``:
    the handlers (SYNC_HANDLERS for the sync phase, EFFECT_HANDLERS for the effects
    phase, whose ``deadman_also`` rows are more systems here)."""
    if "DEADMAN_CONCURRENCY" in os.environ:  # the worker would read it: not the default
        raise RuntimeError("unset DEADMAN_CONCURRENCY: the defaults shape measures the default")
    cases: list[tuple[str, str, Callable[[], dict[str, Any]]]] = []
    pro_n = min(plan.shape_n, plan.procrastinate_n)
    pgq_per_slot = plan.pgqueuer_limited_n_per_slot
    for shape, c in shape_names(plan):
        cases += [
            (
                shape,
                name,
                partial(
                    dm.burn_down,
                    dsns["deadman"],
                    _jobs(plan, noops, plan.shape_n, c or dm.default_concurrency()),
                    1,
                    c,
                    logdir,
                    job_type=job_type,
                    payload=payload,
                ),
            )
            for name, (job_type, payload) in (("deadman", noops.deadman), *noops.deadman_also)
        ]
        cases += [
            (
                shape,
                "pgqueuer",
                partial(
                    pgq.burn_down,
                    dsns["pgqueuer"],
                    plan.shape_n
                    if c is None
                    else _jobs(plan, noops, min(plan.shape_n, c * pgq_per_slot), c),
                    1,
                    None,  # run()'s default batch_size
                    logdir,
                    ready,
                    concurrency_limit=c,
                    entrypoint=noops.pgqueuer,
                ),
            ),
            (
                shape,
                "procrastinate",
                partial(
                    pro.burn_down,
                    dsns["procrastinate"],
                    _jobs(plan, noops, pro_n, c or pro.DEFAULT_CONCURRENCY),
                    1,
                    c,
                    logdir,
                    ready,
                    task=noops.procrastinate,
                ),
            ),
        ]
    results = interleaved(plan.reps, [(f"{shape} {name}", fn) for shape, name, fn in cases])
    out: dict[str, Any] = {
        "defaults_read": {
            "deadman_concurrency": dm.default_concurrency(),
            "pgqueuer_batch_size": pgq.DEFAULT_BATCH,
            "pgqueuer_concurrency_limit": pgq.DEFAULT_LIMIT,
            "procrastinate_concurrency": pro.DEFAULT_CONCURRENCY,
        }
    }
    for (shape, name, _), res in zip(cases, results, strict=True):
        out.setdefault(shape, {})[name] = res
    return out


def io(plan: Plan, dsns: dict[str, str], logdir: Path, ready: Path) -> dict[str, Any]:
    """The shapes again with handlers that wait (bench.common.IO_WAITS_MS), by wait:
    ``out["<ms>ms"][shape][system]``."""
    return {f"{ms}ms": shapes(plan, dsns, logdir, ready, io_handlers(ms)) for ms in IO_WAITS_MS}


def ceiling(plan: Plan, cluster: Any) -> dict[str, Any]:
    """The pgbench batched lifecycle ceiling on this run's cluster (bench.pgbench_ceiling)."""
    return pgbench_ceiling.run(
        create_database(cluster, "bench_pgbench"),
        seconds=plan.ceiling_s,
        clients=plan.ceiling_clients,
        batch=plan.ceiling_batch,
        log=log,
    )


_DEADMAN_WORKER = "1 worker process, concurrency 10" + (
    " (default)" if dm.default_concurrency() == 10 else ""
)
LATENCY_SETTINGS = {
    "deadman": f"{_DEADMAN_WORKER}, Client.enqueue",
    "deadman_async": f"{_DEADMAN_WORKER}, AsyncClient.enqueue",
    "deadman_paired_sync": f"{_DEADMAN_WORKER}, Client.enqueue (its turns of a paired run)",
    "deadman_paired_async": f"{_DEADMAN_WORKER}, AsyncClient.enqueue (its turns of a paired run)",
    "pgqueuer": "1 QueueManager, batch_size 10 (default), Queries.enqueue",
    "procrastinate": "1 worker, concurrency 10, Task.defer_async",
}

PAIRED = {"deadman_paired": ("sync", "async")}  # runs that give one row per client


def latency(plan: Plan, dsns: dict[str, str], work: Path, logdir: Path) -> dict[str, Any]:
    """``plan.reps`` runs per system, interleaved (D, DA, DP, P, R, D, DA, ...; DA:
    Deadman submitting with AsyncClient, DP: with both, in turns), each after the
    cluster has settled; percentiles are the medians over the runs. A paired run
    gives a row per client ('deadman_paired_sync', 'deadman_paired_async'). Each run
    records the cores the machine, the run and others used meanwhile: on a shared
    box, what others took."""
    marks, ready = work / "marks", work / "ready"

    def deadman(clients: dm.Clients) -> Callable[[], dict[str, Any]]:
        return lambda: dm.latency(
            dsns["deadman"], plan.rate, plan.latency_s, marks, logdir, clients
        )

    runners: dict[str, tuple[str, Callable[[], dict[str, Any]]]] = {
        "deadman": ("deadman", deadman("sync")),
        "deadman_async": ("deadman", deadman("async")),
        "deadman_paired": ("deadman", deadman("paired")),
        "pgqueuer": (
            "pgqueuer",
            lambda: pgq.latency(dsns["pgqueuer"], plan.rate, plan.latency_s, marks, logdir, ready),
        ),
        "procrastinate": (
            "procrastinate",
            lambda: pro.latency(
                dsns["procrastinate"], plan.rate, plan.latency_s, marks, logdir, ready
            ),
        ),
    }
    runs: dict[str, list[dict[str, Any]]] = {}
    for rep in range(plan.reps):
        for name, (database, run) in runners.items():
            quiet = settle(dsns[database])
            cpu0, t0 = share_snapshot(), time.time()
            r = guarded(f"{name} latency", run)
            cpu = cpu_share(cpu0, time.time() - t0)
            # A paired run's rows, one per client; a failed run fails each of them.
            if "parts" in r:
                parts = {f"{name}_{k}": v for k, v in r["parts"].items()}
            else:
                parts = {f"{name}_{k}": r for k in PAIRED.get(name, ())} or {name: r}
            for part, pr in parts.items():
                row = {**pr, "cpu_cores": cpu, "settled": quiet}
                runs.setdefault(part, []).append(row)
                log(f"latency rep {rep + 1} {part}: {_latency_line(row)}")
    out = {name: _median_latency(rs) for name, rs in runs.items()}
    for name, r in out.items():
        r["setting"] = LATENCY_SETTINGS[name]
        log(f"latency {name}: {_latency_line(r)} ok={r.get('ok')}")
    return out


def _latency_line(r: dict[str, Any]) -> str:
    return (
        f"p50 {r.get('p50_ms')} p99 {r.get('p99_ms')} p99.9 {r.get('p999_ms')}; enqueue call "
        f"p50 {r.get('enqueue_call_p50_ms')} p99 {r.get('enqueue_call_p99_ms')}; cores "
        f"{r.get('cpu_cores')}"
    )


# Medians over the runs: the total, and the enqueue call's own time (what "the async
# client is not slower than the sync one" is about).
LATENCY_MEDIANS = (
    "p50_ms",
    "p99_ms",
    "p999_ms",
    "enqueue_call_p50_ms",
    "enqueue_call_p99_ms",
    "enqueue_call_p999_ms",
)


def _median_latency(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run with the median p50 (its split, sender and CPU figures), with the
    ``LATENCY_MEDIANS`` replaced by their medians over all runs; any failed run
    fails the lot."""
    good = [r for r in runs if "p50_ms" in r]
    if len(good) < len(runs) or not good:
        failed = next((r for r in runs if "p50_ms" not in r), {"error": "no run"})
        return {**failed, "ok": False, "runs": runs}
    mid = sorted(good, key=lambda r: r["p50_ms"])[len(good) // 2]
    out = dict(mid)
    for key in LATENCY_MEDIANS:
        out[key] = median([r[key] for r in good])
    out["reps"] = [
        {**{k: r[k] for k in LATENCY_MEDIANS}, "cpu_cores": r["cpu_cores"]} for r in good
    ]
    out["ok"] = all(r.get("ok") for r in good)
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


PHASES = (
    "bulk",
    "burn",
    "shapes",
    "sync",
    "effects",
    "io",
    "ceiling",
    "latency",
    "rescue",
    "profile",
    "http",
    "scale",
    "retention",
)
#: Phases a full run made before they existed lacks and is still BENCHMARKS.md
#: (bench.report.render_file): their runs on their own (``--only effects``) render
#: into it beside it.
LATER_PHASES = ("effects", "io")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.run")
    ap.add_argument("--quick", action="store_true", help="small counts, 1 rep, every phase")
    ap.add_argument(
        "--out",
        help="raw JSON path (default bench/results/<mode>-<time>.json, "
        "<mode>-<phase>+<phase>-<time>.json for a subset)",
    )
    ap.add_argument(
        "--md",
        help="report path, plots in a 'plots' directory next to it (default: BENCHMARKS.md "
        "for a full run of every phase, else under bench/results/)",
    )
    ap.add_argument(
        "--only",
        default=",".join(PHASES),
        help="comma-separated subset of " + ",".join(PHASES),
    )
    ap.add_argument(
        "--rev",
        help="measure this commit (package, migrations and bench code) from a git worktree "
        "of it, not this checkout as it is; the results still land in this checkout",
    )
    args = ap.parse_args(argv)
    plan = QUICK if args.quick else FULL
    only = set(args.only.split(","))
    unknown = only - set(PHASES)
    if unknown:
        ap.error(f"unknown phase(s): {', '.join(sorted(unknown))}")
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    results_dir = ROOT / "bench" / "results"
    phases = [p for p in PHASES if p in only]
    # A subset says so in its name (full-latency-<time>.json): bench.report reads the
    # latency-only full runs next to the run of every phase that BENCHMARKS.md is.
    run_name = plan.mode if len(phases) == len(PHASES) else f"{plan.mode}-{'+'.join(phases)}"
    out_path = Path(args.out) if args.out else results_dir / f"{run_name}-{stamp}.json"
    if args.rev:
        child = ["--only", ",".join(phases), "--out", str(out_path.resolve())]
        if args.quick:
            child.append("--quick")
        if args.md:
            child += ["--md", str(Path(args.md).resolve())]
        # A subset's report lands next to its JSON here anyway; BENCHMARKS.md does not.
        everything = plan.mode == "full" and len(phases) == len(PHASES)
        return _at_revision(args.rev, child, out_path, render=everything and not args.md)
    work = out_path.with_suffix("")  # logs, marks: next to the JSON, named like it
    logdir = work / "logs"
    logdir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    data: dict[str, Any] = {
        "plan": asdict(plan),
        "started_at": stamp,
        "load_start": load(),
        "code_start": code_fingerprint(),
        "git_head": _git_head(),
        "phases": phases,
        "deadman_from": str(Path(deadman.__file__).resolve().parent),
        "phase_s": {},
    }

    def phase(name: str, fn: Callable[[], Any]) -> None:
        if name not in only:
            return
        log(f"phase {name}: start")
        t0 = time.monotonic()
        data[name] = fn()
        data["phase_s"][name] = round(time.monotonic() - t0, 1)
        log(f"phase {name}: {data['phase_s'][name]} s")

    with durable_cluster() as cluster:
        dsns = {
            name: create_database(cluster, f"bench_{name}")
            for name in ("deadman", "pgqueuer", "procrastinate")
        }
        t0 = time.monotonic()
        dm.setup(dsns["deadman"])
        pgq.setup(dsns["pgqueuer"])
        pro.setup(dsns["procrastinate"])
        data["machine"] = machine(dsns["deadman"])
        data["machine"]["commit_probe"] = commit_probe(dsns["deadman"])
        data["versions"] = _versions()
        data["phase_s"]["setup"] = round(time.monotonic() - t0, 1)
        log(f"cluster up: {data['machine']['postgres']} {data['machine']['pg_settings']}")
        phase("bulk", lambda: bulk(plan, dsns))
        phase("burn", lambda: burn(plan, dsns, logdir, work / "ready"))
        phase(
            "shapes",
            lambda: guarded("shapes", lambda: shapes(plan, dsns, logdir, work / "ready")),
        )
        phase(
            "sync",
            lambda: guarded(
                "sync", lambda: shapes(plan, dsns, logdir, work / "ready", SYNC_HANDLERS)
            ),
        )
        phase(
            "effects",
            lambda: guarded(
                "effects", lambda: shapes(plan, dsns, logdir, work / "ready", EFFECT_HANDLERS)
            ),
        )
        phase("io", lambda: guarded("io", lambda: io(plan, dsns, logdir, work / "ready")))
        phase("ceiling", lambda: guarded("ceiling", lambda: ceiling(plan, cluster)))
        phase("latency", lambda: latency(plan, dsns, work, logdir))
        phase(
            "rescue",
            lambda: guarded(
                "rescue", lambda: dm.rescue(dsns["deadman"], plan.rescue_n, work / "marks", logdir)
            ),
        )
        if "rescue" in data:
            log(f"rescue: {data['rescue']}")
        phase("profile", lambda: profile(plan, dsns["deadman"], work, logdir))
        phase(
            "http",
            lambda: guarded(
                "http",
                lambda: http_submit.run(
                    create_database(cluster, "bench_http"),
                    plan.http_s,
                    plan.http_clients,
                    logdir,
                    reps=plan.http_reps,
                ),
            ),
        )
        for r in data.get("http", {}).get("results", []):
            log(f"http {r['mode']}: {r['jobs_per_s']} jobs/s ok={r['ok']}")
        phase(
            "scale",
            lambda: guarded(
                "scale",
                lambda: scale.run(
                    create_database(cluster, "bench_scale"),
                    create_database(cluster, "bench_scale_control"),
                    plan.scale_n,
                    plan.scale_samples,
                    logdir,
                    burn_timeout_s=plan.scale_run_timeout_s,
                    log=log,
                ),
            ),
        )
        phase(
            "retention",
            lambda: guarded(
                "retention",
                lambda: retention.run(
                    create_database(cluster, "bench_retention"),
                    duration_s=plan.retention_duration_s,
                    rate=plan.retention_rate,
                    retention_s=plan.retention_keep_s,
                    workers=plan.retention_workers,
                    every_s=plan.retention_every_s,
                    hold=plan.retention_hold,
                    workdir=work,
                    log=log,
                ),
            ),
        )
    data["wall_s"] = round(time.monotonic() - started, 1)
    data["load_end"] = load()
    data["code_end"] = code_fingerprint()
    out_path.write_text(json.dumps(data, indent=2, default=str))
    log(f"raw results: {out_path} ({data['wall_s']} s)")

    from bench import report

    # Only a full run of every phase is BENCHMARKS.md; a subset would drop sections.
    if args.md:
        md = Path(args.md).resolve()
        plots = md.parent / "plots"
    elif plan.mode == "full" and set(PHASES) <= only:
        md, plots = ROOT / "BENCHMARKS.md", ROOT / "bench" / "plots"
    else:
        md, plots = work / "BENCHMARKS.md", work / "plots"
    report.write(data, md, plots)
    log(f"wrote {md} and plots in {plots}")
    if plan.mode == "full" and phases == ["latency"] and not args.md:
        log(
            "BENCHMARKS.md: python -m bench.report bench/results/<the full run of every "
            f"phase>.json renders it with {out_path.name} in its latency section"
        )
    for name, secs in data["phase_s"].items():
        log(f"  {name:<10} {secs:>7.1f} s")
    log(f"  {'total':<10} {data['wall_s']:>7.1f} s")
    failures = _failures(data)
    for f in failures:
        log(f"FAILED: {f}")
    return 1 if failures else 0


def _at_revision(rev: str, argv: list[str], out_path: Path, render: bool) -> int:
    """``python -m bench.run argv`` inside a git worktree of ``rev``: other people's
    edits to this checkout (the package is installed editable) are not measured. The
    JSON and the logs land here (``argv`` has ``--out``); a full run of every phase
    is rendered into this checkout's BENCHMARKS.md (``render``), as bench.report does."""
    keep: list[Path] = []
    try:
        tree, commit = revision_tree(rev, keep)
        log(f"measuring {commit} from {tree}")
        env = {**os.environ, "PYTHONPATH": str(tree)}  # before the editable install's path
        argv = [sys.executable, "-m", "bench.run", *argv]
        rc = subprocess.run(argv, cwd=tree, env=env, check=False).returncode
    finally:
        remove_trees(keep)
    if render and out_path.exists():
        from bench import report

        report.render_file(out_path)
    return rc


def _failures(data: dict[str, Any]) -> list[str]:
    bad = []
    bulk = data.get("bulk", {})
    rows = [(name, r) for name, r in bulk.items() if name not in ("in_calls", "keyed")]
    rows += [(f"{name} in calls", r) for name, r in bulk.get("in_calls", {}).items()]
    rows += [(f"{name} keyed", r) for name, r in bulk.get("keyed", {}).items()]
    rows += [(f"latency {name}", r) for name, r in data.get("latency", {}).items()]
    for name, r in rows:
        if not r.get("ok"):
            label = name if name.startswith("latency") else f"bulk {name}"
            bad.append(f"{label}: {r.get('error') or r.get('verify')}")
    for key in ("shapes", "sync", "effects"):
        sh = data.get(key)
        if sh is None:
            continue
        if "error" in sh:
            bad.append(f"{key}: {sh['error']}")
        for shape, systems in sh.items():
            if shape in ("defaults_read", "ok", "error"):
                continue
            for name, r in systems.items():
                if not r.get("ok"):
                    bad.append(f"{key} {shape} {name}: {r.get('error') or 'verification failed'}")
    for name, runs in data.get("burn", {}).items():
        for r in runs if isinstance(runs, list) else [runs]:
            if not r.get("ok"):
                bad.append(
                    f"burn {name} {r.get('setting') or r.get('concurrency')}: "
                    f"{r.get('error') or 'verification failed'}"
                )
    for section in ("ceiling", "rescue", "profile", "scale", "retention"):
        if section in data and not data[section].get("ok"):
            bad.append(f"{section}: {data[section].get('error') or data[section].get('verify')}")
    http = data.get("http")
    if http is not None and not http.get("ok"):
        if "error" in http:
            bad.append(f"http: {http['error']}")
        elif len(http.get("results", [])) < len(http_submit.MODES):
            bad.append("http: not every mode ran")
        for r in http.get("results", []):
            if not r.get("ok"):
                bad.append(f"http {r['mode']}: {r['verify']}")
    return bad


def _git_head() -> str:
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
