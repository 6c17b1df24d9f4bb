"""Claim latency as the jobs table grows: near-empty, N queued, after N completed.

One claim round trip is what a worker's producer sends (``AsyncStore.job_claim``,
the store call ``Producer._claim_round`` makes, no retries, on a session with the
worker's options: generic plans, no JIT, ``deadman.db.plans``) with the default batch
size (``Settings().claim_size``: half the default 200 slots, 100), timed on the
client with ``perf_counter``:
query, network and building the ``Job`` objects. Each sample is one cycle, only
the claim timed: enqueue ``batch`` no-op jobs (``Client.enqueue_many``), claim
``batch`` (must return exactly that many), finish them (``job_finish_many``, must
accept every one). One pooled connection, after a warm-up of 10 untimed cycles.

Each point's cycles alternate with the same cycles on a second, near-empty control
database (truncated before each point), and the point's ratio is against that
control: on a shared machine, figures taken minutes apart differ by more than the
effect being measured, figures taken in the same seconds do not. The ratio against
the first point (near-empty, measured first) is kept too.

Points, in order, on one fresh database:

- ``near_empty``: the table as a fresh install has it.
- ``queued``: ``n`` jobs enqueued with ``Client.enqueue_many`` (COPY, in chunks),
  then ``VACUUM ANALYZE`` (what autovacuum does to a freshly loaded table within a
  minute or so; done here so the point does not depend on its timing).
- ``completed``: the ``n`` queued jobs run by real ``deadman worker`` processes
  (``--processes 2 --concurrency 200``, defaults otherwise, so their vacuumer runs:
  DECISIONS 72; retention off the table by the default 24 h), then the workers
  stopped and the point measured at once, with whatever dead tuples neither the
  vacuumer nor autovacuum had reclaimed yet.
- ``completed_vacuumed``: the same table after a manual ``VACUUM ANALYZE``.

At each point: the table's and its indexes' sizes, live and dead tuples, and an
``EXPLAIN (ANALYZE, BUFFERS)`` of one claim (rolled back): server time and pages
touched, on a session with the worker's options (the plan the timed claims run) and
on a plain one (a custom plan, for comparison). The timed claims are also matched
against a vacuum of the table running beside them. At the end every job in the
table must be 'succeeded' with exactly one attempt row, 'succeeded'
(bench.deadman_bench.verify); anything else fails.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from bench import deadman_bench as dm
from bench.common import create_database, durable_cluster, pct, stop, wait_for
from deadman import Client
from deadman.config import Settings
from deadman.db.plans import generic_plans
from deadman.db.queries import QUERIES, numbered
from deadman.model import AttemptOutcome, JobState
from deadman.store import AsyncStore, ClaimParams, Finish, claim_params

WORKER_ID = "bench-scale"
WARMUP = 10
POINTS = ("near_empty", "queued", "completed", "completed_vacuumed")

SIZES = """
SELECT c.relname::text AS rel,
       pg_relation_size(c.oid) AS heap_bytes,
       pg_indexes_size(c.oid) AS index_bytes,
       s.n_live_tup, s.n_dead_tup, s.autovacuum_count, s.vacuum_count,
       extract(epoch FROM now() - s.last_autovacuum)::float8 AS last_autovacuum_age_s,
       extract(epoch FROM now() - s.last_vacuum)::float8 AS last_vacuum_age_s
FROM pg_class c JOIN pg_stat_user_tables s ON s.relid = c.oid
WHERE c.oid IN ('deadman.jobs'::regclass, 'deadman.attempt_log'::regclass)
"""


def sizes(dsn: str) -> dict[str, Any]:
    """Sizes and tuple counts of deadman.jobs and deadman.attempt_log, and job states."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        out: dict[str, Any] = {}
        for rel, heap, idx, live, dead, av, vac, av_age, v_age in conn.execute(SIZES).fetchall():
            out[rel] = {
                "last_autovacuum_age_s": None if av_age is None else round(av_age, 1),
                "last_vacuum_age_s": None if v_age is None else round(v_age, 1),
                "heap_bytes": int(heap),
                "index_bytes": int(idx),
                "n_live_tup": int(live),
                "n_dead_tup": int(dead),
                "autovacuum_count": int(av),
                "vacuum_count": int(vac),
            }
        row = conn.execute("SELECT pg_relation_size('deadman.jobs_claim_idx')").fetchone()
        out["jobs_claim_idx_bytes"] = int(row[0]) if row else 0
        out["states"] = {
            str(s): int(c)
            for s, c in conn.execute("SELECT state, count(*) FROM deadman.jobs GROUP BY 1")
        }
    return out


def explain_claim(
    dsn: str, batch: int, ttl_ms: int, n: int = 5, *, worker_session: bool = True
) -> dict[str, Any]:
    """Server side of one claim: EXPLAIN (ANALYZE, BUFFERS) in a rolled-back
    transaction, ``n`` times; the median execution time and the pages touched. Each
    transaction first inserts ``batch`` due jobs (rolled back with it), so the claim
    finds what a timed claim finds: the point's table plus ``batch`` due jobs.

    ``worker_session``: as the timed claims run it, on a session with the worker's
    options (deadman.db.plans: its generic plan, no JIT, no sequential scans),
    prepared and EXPLAIN EXECUTEd; otherwise on a plain session, planned for these
    parameters."""
    params = claim_params(ClaimParams("default", WORKER_ID, batch, ttl_ms))
    text, order = numbered(QUERIES["job_claim"])
    args = sql.SQL(", ").join(sql.Literal(params[k]) for k in order)
    probe: sql.Composable
    if worker_session:
        probe = sql.SQL("EXECUTE claim_probe ({})").format(args)
    else:
        probe = sql.SQL(QUERIES["job_claim"])
    times: list[float] = []
    buffers: list[int] = []
    with psycopg.connect(generic_plans(dsn) if worker_session else dsn) as conn:
        if worker_session:
            conn.execute(sql.SQL("PREPARE claim_probe AS ") + sql.SQL(text))
            conn.commit()
        for _ in range(n):
            conn.execute(
                "INSERT INTO deadman.jobs (type) SELECT 'noop' FROM generate_series(1, %s)",
                (batch,),
            )
            row = conn.execute(
                sql.SQL("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) ") + probe,
                None if worker_session else params,
            ).fetchone()
            conn.rollback()
            assert row is not None
            plan = row[0][0]
            times.append(float(plan["Execution Time"]))
            top = plan["Plan"]
            buffers.append(
                int(top.get("Shared Hit Blocks", 0)) + int(top.get("Shared Read Blocks", 0))
            )
    return {
        "session": "worker (generic plan)" if worker_session else "plain (custom plan)",
        "execution_ms_median": round(statistics.median(times), 3),
        "shared_buffers_median": int(statistics.median(buffers)),
    }


def _stats(lat: list[float]) -> dict[str, Any]:
    lat = sorted(lat)
    return {
        "samples": len(lat),
        "p50_ms": pct(lat, 50),
        "p90_ms": pct(lat, 90),
        "p99_ms": pct(lat, 99),
        "max_ms": round(lat[-1], 3),
        "mean_ms": round(statistics.fmean(lat), 3),
    }


VACUUMING = """
SELECT count(*) FROM pg_stat_progress_vacuum
WHERE datid = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND relid = 'deadman.jobs'::regclass
"""


async def _cycles(
    targets: list[tuple[str, Client]], samples: int, batch: int, ttl_ms: int, time_cap_s: float
) -> tuple[list[list[float]], list[bool]]:
    """``WARMUP + samples`` enqueue/claim/finish cycles on each target database, the
    targets taking turns cycle by cycle; returns each target's timed claims (ms), and
    for each of the first target's whether a vacuum of its deadman.jobs was running
    just after it (read untimed, on a connection of its own)."""
    # the worker's own session settings (generic plans, no JIT: DECISIONS 47), so the
    # claim is timed as the worker's producer sends it
    stores = [
        AsyncStore.create(generic_plans(dsn), min_size=1, max_size=1, retry_s=0)
        for dsn, _ in targets
    ]
    for store in stores:
        await store.open()
    params = ClaimParams("default", WORKER_ID, batch, ttl_ms)
    lat: list[list[float]] = [[] for _ in targets]
    vacuuming: list[bool] = []
    observer = await psycopg.AsyncConnection.connect(targets[0][0], autocommit=True)
    deadline = time.monotonic() + time_cap_s
    try:
        for i in range(WARMUP + samples):
            if time.monotonic() > deadline:
                raise TimeoutError(f"claim samples took over {time_cap_s:.0f} s ({i} done)")
            for k, ((_, client), store) in enumerate(zip(targets, stores, strict=True)):
                client.enqueue_many([client.job("noop") for _ in range(batch)])
                t0 = time.perf_counter()
                jobs = await store.job_claim(params, retry_s=0)
                elapsed = (time.perf_counter() - t0) * 1000
                if len(jobs) != batch:
                    raise AssertionError(f"claim returned {len(jobs)} jobs, expected {batch}")
                finishes = []
                for j in jobs:
                    assert j.lease is not None
                    finishes.append(
                        Finish(j.id, j.lease.token, JobState.SUCCEEDED, AttemptOutcome.SUCCEEDED)
                    )
                done = await store.job_finish_many(finishes)
                if done != {j.id for j in jobs}:
                    raise AssertionError(f"finish accepted {len(done)} of {len(jobs)} jobs")
                if i >= WARMUP:
                    lat[k].append(elapsed)
                    if k == 0:
                        row = await (await observer.execute(VACUUMING)).fetchone()
                        vacuuming.append(bool(row and row[0]))
    finally:
        await observer.close()
        for store in stores:
            await store.close()
    return lat, vacuuming


def measure(
    dsn: str,
    client: Client,
    control: tuple[str, Client],
    samples: int,
    batch: int,
    ttl_ms: int,
    time_cap_s: float,
) -> dict[str, Any]:
    """One point: claims on ``dsn`` interleaved with claims on a near-empty control
    database (truncated first), so the ratio compares two figures taken in the same
    seconds on the same machine; the control's jobs are verified and discarded."""
    control_dsn = control[0]
    dm.truncate(control_dsn)
    before = sizes(dsn)
    plan = explain_claim(dsn, batch, ttl_ms)
    plain = explain_claim(dsn, batch, ttl_ms, worker_session=False)
    t0 = time.monotonic()
    (lat, ctl), vacuuming = asyncio.run(
        _cycles([(dsn, client), control], samples, batch, ttl_ms, time_cap_s)
    )
    wall = time.monotonic() - t0
    ctl_verify = dm.verify(control_dsn, (WARMUP + samples) * batch)
    if not ctl_verify["ok"]:
        raise AssertionError(f"control database failed its check: {ctl_verify}")
    out = _stats(lat)
    c = out["control"] = _stats(ctl)
    out["p50_ratio"] = round(out["p50_ms"] / c["p50_ms"], 2) if c["p50_ms"] else None
    out["p99_ratio"] = round(out["p99_ms"] / c["p99_ms"], 2) if c["p99_ms"] else None
    # how the slow claims line up with a vacuum of the table: claims slower than the
    # control's p99, and how many of those had a vacuum running right after them
    slow = [v for ms, v in zip(lat, vacuuming, strict=True) if ms > c["p99_ms"]]
    out["vacuum"] = {
        "claims_with_vacuum_running": sum(vacuuming),
        "over_control_p99": len(slow),
        "over_control_p99_with_vacuum_running": sum(slow),
    }
    # after too: whether autovacuum reached the table while the claims were timed
    out.update(
        wall_s=round(wall, 2),
        explain=plan,
        explain_plain_session=plain,
        sizes=before,
        sizes_after=sizes(dsn),
    )
    return out


def _count(dsn: str, query: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(query).fetchone()
    return int(row[0]) if row else 0


def run(
    dsn: str,
    control_dsn: str,
    n: int,
    samples: int,
    logdir: Path,
    *,
    batch: int | None = None,
    burn_timeout_s: float = 900.0,
    log: Any = print,
) -> dict[str, Any]:
    """All four points; every loop is bounded in count and in time."""
    defaults = Settings()
    batch = batch or defaults.claim_size
    ttl_ms = int(defaults.lease_ttl_s * 1000)
    cap = 60.0 + samples * 0.4  # per point, both databases: ~20 ms a cycle pair is normal
    dm.truncate(dsn)
    enqueued = 0
    points: dict[str, Any] = {}
    with Client(dsn) as client, Client(control_dsn) as control_client:
        client.get(0)
        control = (control_dsn, control_client)

        def point(name: str) -> None:
            nonlocal enqueued
            points[name] = measure(dsn, client, control, samples, batch, ttl_ms, cap)
            enqueued += (WARMUP + samples) * batch
            p = points[name]
            log(
                f"scale {name}: p50 {p['p50_ms']} ms p99 {p['p99_ms']} ms "
                f"(control p50 {p['control']['p50_ms']} p99 {p['control']['p99_ms']})"
            )

        point("near_empty")
        t0 = time.monotonic()
        chunk = 50_000
        for start in range(0, n, chunk):
            k = min(chunk, n - start)
            ids = client.enqueue_many(client.job("noop") for _ in range(k))
            if len(ids) != k:
                raise AssertionError(f"enqueue_many stored {len(ids)} of a chunk of {k}")
        enqueued += n
        seed_s = time.monotonic() - t0
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("VACUUM ANALYZE deadman.jobs")
        log(f"scale: {n:,} jobs enqueued in {seed_s:.1f} s")
        point("queued")

        # Run the queued jobs with real workers (default settings, the burn-down setting).
        proc = dm._worker(dsn, 2, 200, logdir / "deadman-scale.log")
        t0 = time.monotonic()
        try:
            left_q = (
                "SELECT count(*) FROM deadman.jobs WHERE state IN ('queued', 'running', 'retrying')"
            )
            wait_for(lambda: _count(dsn, left_q) == 0, burn_timeout_s, f"{n:,} jobs to run", 1.0)
        finally:
            stop(proc)
        burn_s = time.monotonic() - t0
        log(f"scale: {n:,} jobs run in {burn_s:.1f} s")
        point("completed")

        t0 = time.monotonic()
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("VACUUM ANALYZE deadman.jobs")
            conn.execute("VACUUM ANALYZE deadman.attempt_log")
        vacuum_s = time.monotonic() - t0
        point("completed_vacuumed")

    verify = dm.verify(dsn, enqueued)
    first = points["near_empty"]
    for name in POINTS:
        p = points[name]
        # against the first point (measured minutes earlier): noisier on a shared machine
        p["p50_vs_first"] = round(p["p50_ms"] / first["p50_ms"], 2) if first["p50_ms"] else None
        p["p99_vs_first"] = round(p["p99_ms"] / first["p99_ms"], 2) if first["p99_ms"] else None
    return {
        "n": n,
        "batch": batch,
        "samples": samples,
        "warmup": WARMUP,
        "seed_s": round(seed_s, 1),
        "seed_jobs_per_s": round(n / seed_s, 1),
        "run_s": round(burn_s, 1),
        "run_jobs_per_s": round(n / burn_s, 1),
        "run_setting": "deadman worker --processes 2 --concurrency 200",
        "vacuum_s": round(vacuum_s, 1),
        "points": points,
        "jobs_total": enqueued,
        "verify": verify,
        "ok": bool(verify["ok"]),
    }


def main(argv: list[str] | None = None) -> int:
    """The scale phase alone, on its own private durable cluster (what bench.run's
    scale phase does, with the counts given here)."""
    ap = argparse.ArgumentParser(prog="python -m bench.scale", description=main.__doc__)
    ap.add_argument("--n", type=int, default=1_000_000, help="jobs queued, then run")
    ap.add_argument("--samples", type=int, default=1_000, help="timed claims per point")
    ap.add_argument("--timeout", type=float, default=900.0, help="bound on running the n jobs")
    ap.add_argument("--out", help="write the raw JSON here")
    ap.add_argument(
        "--autovacuum-naptime",
        type=int,
        help="seconds; ALTER SYSTEM on the private cluster first (a server setting, to "
        "compare with; bench.run never sets it)",
    )
    args = ap.parse_args(argv)
    if args.n < 1 or args.samples < 1:
        ap.error("--n and --samples must be at least 1")
    if args.autovacuum_naptime is not None and not 1 <= args.autovacuum_naptime <= 3600:
        ap.error("--autovacuum-naptime must be 1 to 3600 seconds")
    logdir = Path(args.out).with_suffix("") if args.out else Path("/tmp")
    logdir.mkdir(parents=True, exist_ok=True)
    with durable_cluster() as cluster:
        if args.autovacuum_naptime is not None:
            with psycopg.connect(cluster.dsn(), autocommit=True) as conn:
                conn.execute(f"ALTER SYSTEM SET autovacuum_naptime = {args.autovacuum_naptime:d}")
                conn.execute("SELECT pg_reload_conf()")
        res = run(
            create_database(cluster, "bench_scale"),
            create_database(cluster, "bench_scale_control"),
            args.n,
            args.samples,
            logdir,
            burn_timeout_s=args.timeout,
        )
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=2))
    for name in POINTS:
        p = res["points"][name]
        jobs = p["sizes"].get("jobs", {})
        print(
            f"{name:<20} p50 {p['p50_ms']:.2f} ms ({p['p50_ratio']}x) p99 {p['p99_ms']:.2f} ms "
            f"({p['p99_ratio']}x) server {p['explain']['execution_ms_median']:.3f} ms, "
            f"{p['explain']['shared_buffers_median']} pages; dead {jobs.get('n_dead_tup')}, "
            f"autovacuums {jobs.get('autovacuum_count')} (after the claims "
            f"{p['sizes_after'].get('jobs', {}).get('autovacuum_count')}), last "
            f"{jobs.get('last_autovacuum_age_s')} s before; vacuums (the workers' vacuumer, "
            f"and the point's own) {jobs.get('vacuum_count')}, last "
            f"{jobs.get('last_vacuum_age_s')} s before; claims over the control's p99 "
            f"{p['vacuum']['over_control_p99']}, with a vacuum running "
            f"{p['vacuum']['over_control_p99_with_vacuum_running']} (of all claims "
            f"{p['vacuum']['claims_with_vacuum_running']})"
        )
    print(f"run {res['run_s']} s ({res['run_jobs_per_s']} jobs/s); verified {res['ok']}")
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
