"""Deadman under the benchmark: bulk enqueue, burn-down, latency, rescue, profile.

Workers are real ``deadman worker`` processes (the command users run), with the
handlers of :mod:`bench.deadman_app`. Every run checks its result in the database:
each job 'succeeded' with exactly one attempt row (or, after a rescue, exactly one
'lease_expired' and one 'succeeded' row); anything else fails the run.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any, Literal

import psycopg

from bench.common import (
    PY,
    SENDER_THREADS,
    Send,
    clean_dir,
    cpu_per_job_us,
    cpu_snapshot,
    cpu_used,
    effects_once,
    latency_summary,
    open_loop,
    pct,
    read_marks,
    reset_pg_stats,
    spawn,
    stop,
    top_statements,
    wait_for,
)
from deadman import AsyncClient, Client
from deadman.config import Settings
from deadman.db.migrate import migrate
from deadman.db.queries import QUERIES

APP = "bench.deadman_app:registry"
DEFAULTS = {"DEADMAN_LEASE_TTL_S": "10", "DEADMAN_HEARTBEAT_S": "2", "DEADMAN_RESCUE_S": "1"}


def setup(dsn: str) -> None:
    migrate(dsn)


def truncate(dsn: str) -> None:
    # The package is installed editable: a migration added while a run is going would
    # otherwise stop every worker started after it ("run `deadman migrate`").
    migrate(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "TRUNCATE deadman.jobs, deadman.attempt_log, deadman.workers, deadman.lease_refusals,"
            " deadman.effects, deadman.parked RESTART IDENTITY CASCADE"
        )
        conn.execute("VACUUM ANALYZE deadman.jobs")


def bulk_enqueue(dsn: str, n: int, per_call: int | None = None, keyed: bool = False) -> float:
    """Seconds for ``Client.enqueue_many`` of n no-op jobs (building them included), in
    one call, or in calls of ``per_call`` jobs one after another (all of them timed);
    ``keyed``: each job with an idempotency key of its own, new to the table."""
    truncate(dsn)
    size = per_call or n
    ids: list[int] = []
    with Client(dsn) as client:
        client.get(0)  # open the pool outside the timing
        t0 = time.perf_counter()
        for start in range(0, n, size):
            numbers = range(start, min(start + size, n))
            if keyed:
                ids += client.enqueue_many(
                    client.job("noop", idempotency_key=f"bulk-{i}") for i in numbers
                )
            else:
                ids += client.enqueue_many(client.job("noop") for _ in numbers)
        elapsed = time.perf_counter() - t0
    if len(ids) != n or _count(dsn, "SELECT count(*) FROM deadman.jobs") != n:
        raise AssertionError(f"deadman enqueue_many stored {len(ids)} of {n} jobs")
    return elapsed


def _count(dsn: str, query: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(query).fetchone()
    return int(row[0]) if row else 0


def _worker(
    dsn: str,
    processes: int,
    concurrency: int | None,
    log: Path,
    env: dict[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    """``deadman worker``; ``concurrency=None`` passes no ``--concurrency`` flag, so the
    worker runs at the library's default (what a user who sets nothing gets)."""
    argv = [PY, "-m", "deadman", "worker", "--database-url", dsn, "--app", APP]
    argv += ["--processes", str(processes)]
    if concurrency is not None:
        argv += ["--concurrency", str(concurrency)]
    # the URL in the environment too: bench_effect_plain's own pool reads it
    return spawn(argv, log, {**DEFAULTS, "DEADMAN_DATABASE_URL": dsn, **(env or {})})


def default_concurrency() -> int:
    """The concurrency a ``deadman worker`` without ``--concurrency`` runs at, read from
    the code being measured (``Settings``), never assumed."""
    return Settings().concurrency


def _wait_workers(dsn: str, n: int) -> None:
    q = "SELECT count(*) FROM deadman.workers"
    wait_for(lambda: _count(dsn, q) >= n, 60, f"{n} deadman workers", every=0.1)


def verify(dsn: str, n: int) -> dict[str, Any]:
    """Every job succeeded, with exactly one attempt row, all 'succeeded'; and
    ``deadman.effects`` holds no row, or exactly one per job (the effect shapes)."""
    with psycopg.connect(dsn) as conn:
        effects_ok, effects = effects_once(conn, n, "deadman.effects")
        jobs, succeeded = conn.execute(
            "SELECT count(*), count(*) FILTER (WHERE state = 'succeeded') FROM deadman.jobs"
        ).fetchone() or (0, 0)
        attempts, distinct, ok_attempts = conn.execute(
            "SELECT count(*), count(DISTINCT job_id),"
            " count(*) FILTER (WHERE outcome = 'succeeded') FROM deadman.attempts"
        ).fetchone() or (0, 0, 0)
    ok = jobs == succeeded == attempts == distinct == ok_attempts == n
    ok = ok and effects_ok
    return {
        "ok": ok,
        "effects": effects,
        "jobs": jobs,
        "succeeded": succeeded,
        "attempt_rows": attempts,
        "jobs_with_attempts": distinct,
        "succeeded_attempts": ok_attempts,
    }


# What-if for the profile's first proposal: the worker's own transactions (claim,
# finish, heartbeat) commit without waiting for the WAL flush, while submissions
# (Client, on the plain DSN) stay synchronous. Set through libpq options, so no
# package code changes; never used for the headline numbers.
ASYNC_WORKER_COMMIT = "options=-c%20synchronous_commit%3Doff"


def burn_down(
    dsn: str,
    n: int,
    processes: int,
    concurrency: int | None,
    logdir: Path,
    profile: Path | None = None,
    async_worker_commit: bool = False,
    limit_key: str | None = None,
    job_type: str = "noop",
    payload: Any = None,
) -> dict[str, Any]:
    """Start warm workers on an empty queue, commit n no-op jobs in one COPY, and time
    from that commit to the last job's finished_at (database clock, same machine).
    ``limit_key``: every job carries it (bench/limits_cost.py sets its limit).
    ``job_type``, ``payload``: a built-in handler other than ``noop``.
    ``concurrency=None``: the worker gets no ``--concurrency`` flag (the default)."""
    truncate(dsn)
    worker_dsn = f"{dsn}?{ASYNC_WORKER_COMMIT}" if async_worker_commit else dsn
    tag = "-async" if async_worker_commit else ""
    label = "default" if concurrency is None else str(concurrency)
    proc = _worker(
        worker_dsn, processes, concurrency, logdir / f"deadman-p{processes}c{label}{tag}.log"
    )
    spy: subprocess.Popen[bytes] | None = None
    waits = WaitSampler(dsn)
    try:
        _wait_workers(dsn, processes)
        if profile is not None:
            reset_pg_stats(dsn)
            spy = _py_spy(proc.pid, profile)
            waits.start()
        cpu0, w0 = cpu_snapshot([proc.pid]), time.time()
        with Client(dsn) as client:
            jobs = [client.job(job_type, payload, limit_key=limit_key) for _ in range(n)]
            client.get(0)
            client.enqueue_many(jobs)
            t0 = time.time()
        done_q = "SELECT count(*) FROM deadman.jobs WHERE state = 'succeeded'"
        wait_for(lambda: _count(dsn, done_q) >= n, 60 + n / 200, "deadman burn-down", 0.25)
        window = time.time() - w0
        cpu = cpu_used(cpu0, window, [proc.pid])
        with psycopg.connect(dsn) as conn:
            row = conn.execute(
                "SELECT extract(epoch FROM max(finished_at))::float8 FROM deadman.jobs"
            ).fetchone()
        t1 = float(row[0]) if row else time.time()
    finally:
        if spy is not None:
            spy.send_signal(signal.SIGINT)
            spy.wait(30)
            waits.stop()
        stop(proc)
    result: dict[str, Any] = {
        "processes": processes,
        "concurrency": default_concurrency() if concurrency is None else concurrency,
        "concurrency_flag": concurrency is not None,
        "async_worker_commit": async_worker_commit,
        "n": n,
        "seconds": round(t1 - t0, 4),
        "jobs_per_s": round(n / (t1 - t0), 1),
        "verify": verify(dsn, n),
        "cpu_cores": cpu,
        "cpu_us_per_job": cpu_per_job_us(cpu, window, n),
    }
    if profile is not None:
        result["top_statements"] = top_statements(dsn)
        result["wait_events"] = waits.summary()
    return result


_OTHER_NAMES = {
    "COPY pg_temp.deadman_stage": "job_stage_copy",
    "SELECT count(*) FROM deadman.jobs": "(the benchmark's completion poll)",
}


def _flat(text: str) -> str:
    return " ".join(text.split())


def _known_prefixes() -> list[tuple[str, str]]:
    """(first 60 characters of the statement before its first parameter, name) for
    every named query and the benchmark's own, longest first."""
    pairs = [(_flat(sql).split("%(")[0][:60], name) for name, sql in QUERIES.items()]
    pairs += list(_OTHER_NAMES.items())
    return sorted(pairs, key=lambda p: -len(p[0]))


def _query_name(text: str) -> str:
    flat = _flat(text)
    for prefix, name in _known_prefixes():
        if prefix and flat.startswith(prefix):
            return name
    return flat[:50]


class WaitSampler(threading.Thread):
    """Samples what the workers' backends are doing every 20 ms (pg_stat_activity):
    on CPU, waiting for a row lock, for the WAL flush of a commit, or for the client."""

    def __init__(self, dsn: str) -> None:
        super().__init__(daemon=True)
        self._dsn = dsn
        self._halt = threading.Event()
        self.counts: Counter[tuple[str, str]] = Counter()
        self.samples = 0

    def run(self) -> None:
        with psycopg.connect(self._dsn, autocommit=True) as conn:
            while not self._halt.is_set():
                rows = conn.execute(
                    "SELECT coalesce(wait_event_type || ':' || wait_event, 'on CPU'),"
                    " left(regexp_replace(query, '^(\\s*--[^\\n]*\\n)+', ''), 60)"
                    " FROM pg_stat_activity WHERE datname = current_database()"
                    " AND pid <> pg_backend_pid() AND state = 'active'"
                ).fetchall()
                self.samples += 1
                for wait, query in rows:
                    self.counts[(wait, _query_name(query))] += 1
                time.sleep(0.02)

    def stop(self) -> None:
        self._halt.set()
        self.join(5)

    def summary(self, top: int = 10) -> dict[str, Any]:
        return {
            "samples": self.samples,
            "top": [
                {"wait": w, "query": q, "active_backends_avg": round(c / max(self.samples, 1), 2)}
                for (w, q), c in self.counts.most_common(top)
            ],
        }


def _py_spy(pid: int, out: Path) -> subprocess.Popen[bytes]:
    spy = Path(PY).with_name("py-spy")
    argv = [str(spy), "record", "--pid", str(pid), "--rate", "250", "--format", "raw"]
    argv += ["--output", str(out), "--nonblocking"]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.0)  # py-spy attaches
    return proc


# Which client submits: Client.enqueue, AsyncClient.enqueue, or both taking turns.
Clients = Literal["sync", "async", "paired"]


def _async_turn(clients: Clients, i: int) -> bool:
    """Whether job i is sent with AsyncClient. 'paired' alternates within each sender
    thread (whose sends are i = k, k + SENDER_THREADS, ...), so both clients meet the
    same moments of a shared machine and their figures can be compared run by run."""
    if clients == "paired":
        return (i // SENDER_THREADS) % 2 == 1
    return clients == "async"


def _sender(dsn: str, clients: Clients) -> contextlib.AbstractAsyncContextManager[Send]:
    """One Client and one AsyncClient per sender thread, like the peers' connections
    (an AsyncClient's pool belongs to its thread's loop); only those used connect.
    ``Client.enqueue`` blocks the thread's loop, which has nothing else to do."""

    @contextlib.asynccontextmanager
    async def sender() -> AsyncIterator[Send]:
        with Client(dsn) as client:
            async with AsyncClient(dsn) as aclient:
                # connect before the clock starts
                if clients != "async":
                    client.get(0)
                if clients != "sync":
                    await aclient.get(0)

                async def send(i: int, intended: float) -> None:
                    payload = {"i": i, "t": intended}
                    if _async_turn(clients, i):
                        await aclient.enqueue("bench_mark", payload)
                    else:
                        client.enqueue("bench_mark", payload)

                yield send

    return sender()


def latency(
    dsn: str,
    rate: float,
    seconds: float,
    markdir: Path,
    logdir: Path,
    clients: Clients = "sync",
) -> dict[str, Any]:
    """Open-loop single-job submissions to one default worker, with ``clients``; the
    same schedule and harness for each. A 'paired' run is summarized per client, as
    ``{"parts": {"sync": ..., "async": ...}}``."""
    truncate(dsn)
    clean_dir(markdir)
    log = logdir / f"deadman-latency-{clients}.log"
    proc = _worker(dsn, 1, 10, log, {"BENCH_MARK_DIR": str(markdir)})
    n = round(rate * seconds)
    try:
        _wait_workers(dsn, 1)
        time.sleep(0.5)
        sent = open_loop(lambda: _sender(dsn, clients), rate, seconds)
        wait_for(lambda: len(read_marks(markdir)) >= n, 60, "deadman latency jobs", 0.1)
        time.sleep(0.5)  # a doubled execution would show up now
        done_q = "SELECT count(*) FROM deadman.jobs WHERE state = 'succeeded'"
        wait_for(lambda: _count(dsn, done_q) >= n, 30, "deadman latency completions", 0.1)
    finally:
        stop(proc)
    checked = verify(dsn, n)
    marks = read_marks(markdir)
    if clients != "paired":
        return _summary(marks, range(n), sent, checked)
    parts = {
        part: _summary(
            [m for m in marks if _async_turn(clients, m[0]) == is_async],
            [i for i in range(n) if _async_turn(clients, i) == is_async],
            sent,
            checked,
        )
        for part, is_async in (("sync", False), ("async", True))
    }
    return {"parts": parts}


def _summary(
    marks: list[tuple[int, float, float]],
    ids: Sequence[int],
    sent: dict[str, Any],
    checked: dict[str, Any],
) -> dict[str, Any]:
    """latency_summary of the jobs ``ids`` (all of a run, or one client's turns)."""
    raw = {key: {i: sent[key][i] for i in ids} for key in ("ack_at", "call_s")}
    figures = {k: v for k, v in sent.items() if k not in raw}
    out = latency_summary(marks, len(ids), {**figures, **raw})
    out["sender"] = figures
    out["verify"] = checked
    out["ok"] = out["ok"] and checked["ok"]
    return out


def rescue(dsn: str, n: int, markdir: Path, logdir: Path) -> dict[str, Any]:
    """SIGKILL a worker holding n sleeping jobs; how long until each runs again on a
    second worker? Default TTL 10 s, heartbeat 2 s, rescue tick 1 s."""
    truncate(dsn)
    clean_dir(markdir)
    env = {"BENCH_MARK_DIR": str(markdir)}
    a = _worker(dsn, 1, n, logdir / "deadman-rescue-a.log", env)
    b: subprocess.Popen[bytes] | None = None
    try:
        _wait_workers(dsn, 1)
        with Client(dsn) as client:
            client.enqueue_many(client.job("bench_hold", {"ms": 120_000}) for _ in range(n))
        wait_for(lambda: len(read_marks(markdir)) >= n, 30, "jobs held by worker A", 0.1)
        b = _worker(dsn, 1, n, logdir / "deadman-rescue-b.log", env)
        _wait_workers(dsn, 2)
        time.sleep(0.5)
        killed_at = time.time()
        os.kill(a.pid, signal.SIGKILL)
        a.wait(10)
        ttl, hb, tick = (float(DEFAULTS[k]) for k in DEFAULTS)

        def rerun() -> list[float]:
            return [s for _, r, s in read_marks(markdir) if r >= 1]

        wait_for(lambda: len(rerun()) >= n, ttl + tick + 30, "rescued jobs to run again", 0.1)
        done_q = "SELECT count(*) FROM deadman.jobs WHERE state = 'succeeded'"
        wait_for(lambda: _count(dsn, done_q) >= n, 30, "rescued jobs to finish", 0.1)
    finally:
        if b is not None:
            stop(b)
        stop(a)
    lat = sorted(s - killed_at for s in rerun())
    with psycopg.connect(dsn) as conn:
        outcomes: Counter[str] = Counter(
            {
                str(o): int(c)
                for o, c in conn.execute(
                    "SELECT outcome, count(*) FROM deadman.attempts GROUP BY 1"
                )
            }
        )
        states: dict[str, int] = {
            str(s): int(c)
            for s, c in conn.execute("SELECT state, count(*) FROM deadman.jobs GROUP BY 1")
        }
    starts = Counter(i for i, _, _ in read_marks(markdir))
    ok = (
        states == {"succeeded": n}
        and outcomes == Counter({"lease_expired": n, "succeeded": n})
        and all(c == 2 for c in starts.values())
        and len(starts) == n
    )
    return {
        "n": n,
        "lease_ttl_s": ttl,
        "heartbeat_s": hb,
        "rescue_s": tick,
        "bound_s": ttl + tick + 1,
        "p50_s": pct(lat, 50),
        "p99_s": pct(lat, 99),
        "max_s": round(lat[-1], 3),
        "min_s": round(lat[0], 3),
        "within_bound": lat[-1] <= ttl + tick + 1,
        "attempt_outcomes": dict(outcomes),
        "ok": ok,
    }


# Where the worker's CPU goes, by concern: the share of on-CPU samples whose stack
# contains the pattern (inclusive, so the groups overlap with "psycopg").
PROFILE_GROUPS = {
    "psycopg (query send/receive, adaptation)": "psycopg/",
    "structlog (a log line per job)": "structlog/",
    "JobContext.__init__ (the per-job context)": "JobContext.__init__",
    "json (log rendering, result check)": "json/",
    "prometheus_client (metrics per job)": "prometheus_client",
    "Job.from_row (claimed row to dataclass)": "from_row (",
    "tenacity (retry wrapper per statement)": "tenacity/",
    "asyncio create_task / wait_for": "create_task (",
    "psycopg_pool (connection checkout)": "psycopg_pool/",
}


def profile_groups(raw: Path) -> dict[str, float]:
    total, hits = 0, dict.fromkeys(PROFILE_GROUPS, 0)
    for line in raw.read_text(encoding="utf-8", errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        total += int(count)
        for name, pattern in PROFILE_GROUPS.items():
            if pattern in stack:
                hits[name] += int(count)
    return {k: round(100 * v / total, 1) for k, v in hits.items()} if total else {}


def summarize_profile(raw: Path, top: int = 60) -> dict[str, Any]:
    """Self and inclusive sample shares per function from py-spy's collapsed stacks."""
    self_t: Counter[str] = Counter()
    incl: Counter[str] = Counter()
    total = 0
    for line in raw.read_text(encoding="utf-8", errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        c = int(count)
        total += c
        frames = [_frame(f) for f in stack.split(";")]
        if frames:
            self_t[frames[-1]] += c
        for f in set(frames):
            incl[f] += c
    if total == 0:
        return {"samples": 0, "self": [], "inclusive": []}

    def share(counter: Counter[str]) -> list[dict[str, Any]]:
        return [
            {"function": f, "pct": round(100 * c / total, 1)} for f, c in counter.most_common(top)
        ]

    return {
        "samples": total,
        "self": share(self_t),
        "inclusive": share(incl),
        "groups": profile_groups(raw),
    }


def _frame(frame: str) -> str:
    """'func (path/to/mod.py:12)' -> 'func (mod.py)'; keeps the package for deadman."""
    name, _, where = frame.partition(" (")
    path = where.rstrip(")").rsplit(":", 1)[0]
    parts = Path(path).parts
    for anchor in ("deadman", "psycopg", "psycopg_pool", "structlog", "asyncio"):
        if anchor in parts:
            idx = len(parts) - 1 - parts[::-1].index(anchor)
            return f"{name} ({'/'.join(parts[idx:])})"
    return f"{name} ({Path(path).name})"
