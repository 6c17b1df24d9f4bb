"""What every benchmark shares: the durable cluster, machine facts, marks, stats.

The cluster is a private one made with ``devdb.Cluster(...).init(fast=False)``: fsync
and full_page_writes stay on and ``synchronous_commit`` is on, so every number here
is a number a durable production set-up would see (never ``devdb.throwaway()``,
which turns fsync off).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import os
import platform
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from deadman import devdb

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable


# --------------------------------------------------------------------------- cluster


#: The io phase's handlers wait this long (ms), each as a handler of its own in every
#: system (``io_<ms>``): the stand-in for a call to another service, where a job spends
#: its time waiting, not computing.
IO_WAITS_MS = (10, 100)


def io_name(ms: int) -> str:
    """The io handler's name (pgqueuer entrypoint, procrastinate task) for one wait."""
    return f"io_{ms}"


#: what a run's setting says about each io handler (the peers' labels)
IO_LABELS = {io_name(ms): f", awaits {ms} ms" for ms in IO_WAITS_MS}


def io_handler(ms: int) -> Callable[..., Awaitable[None]]:
    """The io phase's handler for one wait, every system's: it awaits ``ms`` and
    returns, whatever it is called with (Deadman passes the job and its context,
    pgqueuer the job, procrastinate nothing)."""

    async def wait(*_: Any) -> None:
        await asyncio.sleep(ms / 1000)

    return wait


@contextlib.contextmanager
def durable_cluster() -> Iterator[devdb.Cluster]:
    """A fresh durable cluster in a temp dir, destroyed on exit."""
    root = Path(tempfile.mkdtemp(prefix="deadman-bench-", dir="/tmp"))
    root.chmod(0o755)  # the postgres user must be able to enter it
    cluster = devdb.Cluster(root / "data")
    cluster._owned_root = root
    try:
        cluster.init(fast=False)
        # pg_stat_statements: per-query server time for the profile section. It is
        # loaded for every system alike, so it costs each of them the same.
        with (cluster.datadir / "postgresql.conf").open("a", encoding="utf-8") as conf:
            conf.write(
                "shared_preload_libraries = 'pg_stat_statements'\n"
                "synchronous_commit = on\n"
                "max_connections = 300\n"
            )
        cluster.start()
        POSTMASTER[:] = [int((cluster.datadir / "postmaster.pid").read_text().split()[0])]
        yield cluster
    finally:
        cluster.destroy()


def create_database(cluster: devdb.Cluster, name: str) -> str:
    with psycopg.connect(cluster.dsn(), autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(name)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    dsn = cluster.dsn(name)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
    return dsn


def machine(dsn: str) -> dict[str, Any]:
    """CPU, cores, memory, Postgres version and the settings that decide durability."""
    cpu = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem_kib = 0
    with contextlib.suppress(OSError, ValueError):
        first = Path("/proc/meminfo").read_text().splitlines()[0]
        mem_kib = int(first.split()[1])
    settings = {}
    with psycopg.connect(dsn) as conn:
        version = conn.execute("SHOW server_version").fetchone()
        for name in (
            "synchronous_commit",
            "fsync",
            "full_page_writes",
            "shared_buffers",
            "wal_level",
            "max_connections",
        ):
            row = conn.execute(sql.SQL("SHOW {}").format(sql.Identifier(name))).fetchone()
            settings[name] = row[0] if row else None
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": round(mem_kib / 1024 / 1024, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "postgres": version[0] if version else None,
        "pg_settings": settings,
    }


def reset_pg_stats(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_statements_reset()")


def top_statements(dsn: str, limit: int = 8) -> list[dict[str, Any]]:
    """The statements of this database that took the most server time."""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            """
            SELECT left(regexp_replace(s.query, '\\s+', ' ', 'g'), 110) AS query,
                   s.calls, round(s.total_exec_time::numeric, 1) AS total_ms,
                   round(s.mean_exec_time::numeric, 3) AS mean_ms, s.rows
            FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
            WHERE d.datname = current_database()
            ORDER BY s.total_exec_time DESC LIMIT %s
            """,
            (limit,),
        ).fetchall()
    return [
        {"query": q, "calls": c, "total_ms": float(t), "mean_ms": float(m), "rows": r}
        for q, c, t, m, r in rows
    ]


# --------------------------------------------------------------------------- revisions


def revision_tree(rev: str, keep: list[Path]) -> tuple[Path, str]:
    """(directory, commit) for a revision: a ``git worktree`` of it, appended to
    ``keep`` (``remove_trees`` removes them); '.' is this checkout as it is."""
    if rev == ".":
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=ROOT,
            capture_output=True,
            text=True,
        ).stdout.strip()
        return ROOT, head + ("+changes" if dirty else "")
    commit = subprocess.run(
        ["git", "rev-parse", "--short", rev], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    where = Path(tempfile.mkdtemp(prefix=f"deadman-rev-{commit}-"))
    subprocess.run(
        ["git", "worktree", "add", "--detach", "--force", str(where), commit],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    keep.append(where)
    return where, commit


def remove_trees(keep: list[Path]) -> None:
    for where in keep:
        subprocess.run(["git", "worktree", "remove", "--force", str(where)], cwd=ROOT, check=False)


# --------------------------------------------------------------------------- processes


def spawn(argv: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """Start a worker with its output in ``log`` (a pipe nobody reads would fill up)."""
    handle = log.open("ab")
    full_env = dict(os.environ, PYTHONPATH=str(ROOT), **(env or {}))
    return subprocess.Popen(
        argv,
        stdout=handle,
        stderr=subprocess.STDOUT,
        env=full_env,
        cwd=ROOT,
        start_new_session=True,
    )


def stop(proc: subprocess.Popen[bytes], timeout: float = 20.0) -> None:
    """SIGTERM, then SIGKILL the process group if it does not leave in time."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(5)


#: The peers' table for the effect shapes (Deadman's handlers write deadman.effects).
EFFECTS_DDL = "CREATE TABLE IF NOT EXISTS bench_effects (job_id bigint NOT NULL)"


def effects_once(
    conn: psycopg.Connection[Any], n: int, table: str = "bench_effects"
) -> tuple[bool, int]:
    """The effect shapes' check, every system's: ``table`` (``schema.name`` or a name)
    holds no row (a shape without effects), or exactly one per job of ``n``. Returns
    whether it does, and its rows."""
    query = sql.SQL("SELECT count(*), count(DISTINCT job_id) FROM {}").format(
        sql.Identifier(*table.split("."))
    )
    rows, jobs = conn.execute(query).fetchone() or (0, 0)
    return rows == jobs and rows in (0, n), int(rows)


def wait_for(check: Callable[[], bool], timeout: float, what: str, every: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(every)


def wait_ready_files(ready_dir: Path, n: int, timeout: float = 60.0) -> None:
    wait_for(lambda: len(list(ready_dir.glob("ready-*"))) >= n, timeout, f"{n} peer workers")


def mark_ready(ready_dir: str | None) -> None:
    """Called by a peer worker once it is set up (the orchestrator waits for these)."""
    if ready_dir:
        Path(ready_dir, f"ready-{os.getpid()}").touch()


# --------------------------------------------------------------------------- marks
# Handlers under test call record(i, intended) at their first line: one line
# "i intended started" per execution, in a file per process. time.time() on both
# sides: the sender and the workers run on the same machine.

_mark_file: Any = None


def record(i: int, intended: float) -> None:
    global _mark_file
    started = time.time()
    if _mark_file is None:
        directory = os.environ["BENCH_MARK_DIR"]
        _mark_file = open(  # noqa: SIM115 - kept open for the life of the worker
            Path(directory, f"marks-{os.getpid()}.txt"), "a", buffering=1, encoding="ascii"
        )
    _mark_file.write(f"{i} {intended:.6f} {started:.6f}\n")


def read_marks(directory: Path) -> list[tuple[int, float, float]]:
    out = []
    for path in directory.glob("marks-*.txt"):
        for line in path.read_text(encoding="ascii").splitlines():
            parts = line.split()
            if len(parts) == 3:
                out.append((int(parts[0]), float(parts[1]), float(parts[2])))
    return out


Send = Callable[[int, float], Awaitable[None]]

# How long before its intended time a sender thread stops sleeping and spins: the
# kernel wakes a sleeper ~0.1 ms late even with a 1 ns timer slack, and asyncio's
# timers (epoll's millisecond timeout) 0.7 ms late at p50. That lateness is the
# harness's, not the queue's, so the sender spins the last 0.2 ms to fire on time.
SPIN_S = 0.0002
SENDER_THREADS = 4


def _precise_timers() -> None:
    """Ask Linux for a 1 ns timer slack on this thread (default 50 us)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(29, 1, 0, 0, 0)  # PR_SET_TIMERSLACK


def _wait_until(intended: float) -> float:
    """Sleep, then spin, until ``intended``; return how late we are (s, >= 0)."""
    delay = intended - time.time() - SPIN_S
    if delay > 0:
        time.sleep(delay)
    while time.time() < intended:
        pass
    return time.time() - intended


def open_loop(
    sender: Callable[[], contextlib.AbstractAsyncContextManager[Send]],
    rate: float,
    seconds: float,
    threads: int = SENDER_THREADS,
) -> dict[str, Any]:
    """Send ``rate`` jobs/s for ``seconds``, each at its intended time, without waiting
    for earlier sends (open loop): latency is measured from the intended time, so a
    slow send is never hidden (no coordinated omission).

    ``threads`` sender threads take every ``threads``-th send; each has its own
    event loop and its own ``sender()`` (connection or client) and sleeps until each
    intended time with a precise timer. A send that takes longer than
    ``threads / rate`` seconds delays that thread's next one, and that delay is
    counted in the next job's latency (``send_lag`` reports it). Each send's own
    duration (from the moment it starts to its return, ``perf_counter``) is kept in
    ``call_s``: what the enqueue call itself costs the caller, lateness excluded."""
    n = round(rate * seconds)
    ack_at: dict[int, float] = {}
    call_s: dict[int, float] = {}
    lags: list[float] = []
    errors: list[BaseException] = []
    ready = threading.Barrier(threads + 1)
    start_box: list[float] = []

    async def run(k: int) -> None:
        async with sender() as send:
            ready.wait()
            ready.wait()  # the start time is set between the two
            start = start_box[0]
            for i in range(k, n, threads):
                intended = start + i / rate
                lags.append(_wait_until(intended))
                began = time.perf_counter()
                await send(i, intended)
                call_s[i] = time.perf_counter() - began
                ack_at[i] = time.time()

    def thread(k: int) -> None:
        _precise_timers()
        try:
            asyncio.run(run(k))
        except BaseException as exc:  # reported to the caller below
            errors.append(exc)
            ready.abort()

    pool = [threading.Thread(target=thread, args=(k,), daemon=True) for k in range(threads)]
    for t in pool:
        t.start()
    try:
        ready.wait(timeout=60)
        start_box.append(time.time() + 0.2)
        ready.wait(timeout=60)
    except threading.BrokenBarrierError:
        pass
    for t in pool:
        t.join(timeout=seconds + 120)
    if errors:
        raise errors[0]
    if any(t.is_alive() for t in pool) or len(ack_at) != n:
        raise RuntimeError(f"open loop: {len(ack_at)} of {n} sends acknowledged in time")
    lags.sort()
    return {
        "sent": n,
        "sender_threads": threads,
        "send_lag_p50_ms": pct([x * 1000 for x in lags], 50),
        "send_lag_p99_ms": pct([x * 1000 for x in lags], 99),
        "max_send_lag_ms": round(lags[-1] * 1000, 3),
        "ack_at": ack_at,
        "call_s": call_s,
    }


def settle(dsn: str, timeout_s: float = 120.0) -> dict[str, Any]:
    """Let the cluster go quiet before a latency run: a CHECKPOINT (so none starts in
    the middle of it) and no autovacuum worker busy (the burn-downs before leave
    plenty to vacuum). Whichever system ran right after a heavy phase would
    otherwise pay for it. Gives up waiting after ``timeout_s`` and says so."""
    start = time.time()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CHECKPOINT")

        def vacuum_idle() -> bool:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'autovacuum worker'"
            ).fetchone()
            return row is not None and int(row[0]) == 0

        try:
            wait_for(vacuum_idle, timeout_s, "autovacuum to finish", every=0.5)
            quiet = True
        except TimeoutError:
            quiet = False
    return {"settle_s": round(time.time() - start, 2), "autovacuum_idle": quiet}


def commit_probe(dsn: str, n: int = 300) -> dict[str, Any]:
    """Single-row INSERT + COMMIT round trips on one connection: what a durable
    commit costs on this machine's disk (it bounds every system measured here)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS public.commit_probe (v int)")
        lat = []
        for _ in range(n):
            t = time.perf_counter()
            conn.execute("INSERT INTO public.commit_probe (v) VALUES (1)")
            lat.append((time.perf_counter() - t) * 1000)
        conn.execute("DROP TABLE public.commit_probe")
    lat.sort()
    return {"n": n, "p50_ms": pct(lat, 50), "p99_ms": pct(lat, 99), "max_ms": round(lat[-1], 3)}


def latency_summary(
    marks: list[tuple[int, float, float]], n: int, sender: dict[str, Any]
) -> dict[str, Any]:
    """p50/p99/p99.9 of handler start - intended send; checks each job ran once.

    Split in two: intended send -> the enqueue call returned (its durable COMMIT,
    the submitter's side) and that return -> handler start (the queue's side). The
    enqueue call's own duration (``open_loop``'s ``call_s``) is summarized too."""
    ack_at: dict[int, float] = sender.pop("ack_at", {})
    calls = sorted(x * 1000 for x in sender.pop("call_s", {}).values())
    intended_of = {i: t for i, t, _ in marks}
    acks = sorted((a - intended_of[i]) * 1000 for i, a in ack_at.items() if i in intended_of)
    after = sorted((s - ack_at[i]) * 1000 for i, _, s in marks if i in ack_at)
    seen: dict[int, int] = {}
    for i, _, _ in marks:
        seen[i] = seen.get(i, 0) + 1
    missing = n - len(seen)
    doubled = sum(1 for c in seen.values() if c > 1)
    lat = sorted((s - t) * 1000 for _, t, s in marks)
    return {
        "n": n,
        "executions": len(marks),
        "missing": missing,
        "doubled": doubled,
        "ok": missing == 0 and doubled == 0,
        "p50_ms": pct(lat, 50),
        "p99_ms": pct(lat, 99),
        "p999_ms": pct(lat, 99.9),
        "max_ms": round(lat[-1], 3) if lat else None,
        "enqueue_ack_p50_ms": pct(acks, 50),
        "enqueue_ack_p99_ms": pct(acks, 99),
        "enqueue_ack_p999_ms": pct(acks, 99.9),
        "enqueue_call_p50_ms": pct(calls, 50),
        "enqueue_call_p99_ms": pct(calls, 99),
        "enqueue_call_p999_ms": pct(calls, 99.9),
        "ack_to_start_p50_ms": pct(after, 50),
        "ack_to_start_p99_ms": pct(after, 99),
        "ack_to_start_p999_ms": pct(after, 99.9),
    }


# --------------------------------------------------------------------------- stats


def pct(sorted_values: list[float], p: float) -> float | None:
    """Nearest-rank percentile of an already sorted list."""
    if not sorted_values:
        return None
    k = max(0, min(len(sorted_values) - 1, round(p / 100 * len(sorted_values) + 0.5) - 1))
    return round(sorted_values[k], 3)


def median(values: list[float]) -> float:
    return statistics.median(values)


def write_results(data: dict[str, Any], prefix: str, out: str | None = None) -> Path:
    """``data`` as indented JSON at ``out``, or by default at
    ``bench/results/<prefix>-<UTC time>.json``; the path written."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    path = Path(out) if out else ROOT / "bench" / "results" / f"{prefix}-{stamp}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path


def clean_dir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    for f in path.iterdir():
        if f.is_file():
            f.unlink()
    return path


# --------------------------------------------------------------------------- cpu


POSTMASTER: list[int] = []  # set by durable_cluster(): the bench cluster's postmaster


def cpu_snapshot(roots: list[int]) -> dict[int, tuple[str, int]]:
    """pid -> (kind, utime+stime ticks) for every process. kind: 'workers' (in the
    process trees of ``roots``), 'postgres' (this run's cluster), 'profiler' (our
    py-spy) or 'other' (anything else on the machine: it shows interference)."""
    raw: dict[int, tuple[str, int, int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        raw[int(entry.name)] = (comm, int(fields[1]), int(fields[11]) + int(fields[12]))
    out: dict[int, tuple[str, int]] = {-1: ("machine_busy", _busy_ticks())}
    me = os.getpid()
    for pid, (comm, _, ticks) in raw.items():
        kind, cur, seen = "other", pid, 0
        while cur in raw and seen < 50:
            if cur in roots:
                kind = "workers"
                break
            if cur in POSTMASTER:
                kind = "postgres"
                break
            if cur == me:
                kind = "profiler" if comm.startswith("py-spy") else "bench"
                break
            cur, seen = raw[cur][1], seen + 1
        out[pid] = (kind, ticks)
    return out


def _busy_ticks() -> int:
    """Non-idle CPU ticks of the whole machine, all cores (from /proc/stat)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return sum(fields) - fields[3] - fields[4]  # minus idle and iowait


def cpu_used(
    before: dict[int, tuple[str, int]], wall_s: float, roots: list[int]
) -> dict[str, float]:
    """Cores used on average per kind since ``before`` (processes that exited in
    between are not counted: short-lived client backends are missed)."""
    after = cpu_snapshot(roots)
    after[-1] = ("machine_busy", _busy_ticks())  # the sampling itself is not counted
    hz = os.sysconf("SC_CLK_TCK")
    used: dict[str, float] = {}
    for pid, (kind, ticks) in after.items():
        start = before.get(pid, (kind, 0))[1]
        used[kind] = used.get(kind, 0.0) + (ticks - start) / hz
    return {k: round(v / wall_s, 2) for k, v in used.items() if wall_s > 0}


def cpu_per_job_us(cpu: dict[str, float], window_s: float, n: int) -> dict[str, float]:
    """CPU time per job in microseconds, per kind (workers, postgres): cores used on
    average times the window they were measured over, divided by the jobs done in
    it. Unlike cores, this does not depend on how much idle time the window held."""
    kinds = ("workers", "postgres")
    return {k: round(cpu.get(k, 0.0) * window_s / n * 1e6, 1) for k in kinds if n}


def _stat_fields(pid: int) -> list[str]:
    """/proc/<pid>/stat after the command name: [0] state, [1] ppid, ... [11] utime,
    [12] stime, [13] cutime, [14] cstime (reaped children), in clock ticks."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2 :].split()


def process_cpu_s(pid: int) -> float:
    """Seconds of CPU (user and system) one live process has used so far."""
    f = _stat_fields(pid)
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def _postgres_ticks() -> int:
    """This run's cluster: the postmaster, its live backends, and the backends it has
    reaped (cutime/cstime), so connections that came and went are counted."""
    if not POSTMASTER:
        return 0
    pm = POSTMASTER[0]
    try:
        f = _stat_fields(pm)
    except OSError:
        return 0
    total = sum(int(x) for x in f[11:15])
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError):
            child = _stat_fields(int(entry.name))
            if int(child[1]) == pm:
                total += int(child[11]) + int(child[12])
    return total


def _pressure_s() -> float:
    """Seconds some runnable task waited for a CPU, since boot (PSI), or 0."""
    with contextlib.suppress(OSError, IndexError, ValueError):
        line = Path("/proc/pressure/cpu").read_text().splitlines()[0]
        return int(line.split("total=")[1]) / 1e6
    return 0.0


def share_snapshot() -> dict[str, float]:
    """Cumulative CPU seconds now: the machine (non-idle), this harness with every
    child it has reaped (the workers it started and stopped: unlike cpu_snapshot,
    processes that came and went are counted), this run's Postgres, and the time
    runnable tasks waited for a CPU (``cpu_share`` turns two of these into cores)."""
    hz = os.sysconf("SC_CLK_TCK")
    me, kids = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return {
        "machine": _busy_ticks() / hz,
        "bench": me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime,
        "postgres": _postgres_ticks() / hz,
        "pressure": _pressure_s(),
    }


def cpu_share(before: dict[str, float], wall_s: float) -> dict[str, float]:
    """Cores used on average since ``before``: the whole machine, this harness and its
    workers ('bench'), this run's Postgres, and everything else ('others': other
    people's work on a shared box); 'cpu_pressure_pct': the share of the time some
    runnable task waited for a CPU."""
    now = share_snapshot()
    d = {k: (now[k] - before[k]) / wall_s for k in now} if wall_s > 0 else dict.fromkeys(now, 0.0)
    return {
        "machine": round(d["machine"], 2),
        "bench": round(d["bench"], 2),
        "postgres": round(d["postgres"], 2),
        "others": round(max(d["machine"] - d["bench"] - d["postgres"], 0.0), 2),
        "cpu_pressure_pct": round(100 * d["pressure"], 1),
    }


def code_fingerprint() -> str:
    """A hash of the package and migrations as they are on disk now (the package is
    installed editable, so edits made during a run change what is measured)."""
    import hashlib

    h = hashlib.sha256()
    for path in sorted(
        [
            *ROOT.glob("deadman/**/*.py"),
            *ROOT.glob("migrations/*.sql"),
            *ROOT.glob("deadman/**/*.sql"),
        ]
    ):
        h.update(str(path.relative_to(ROOT)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:12]


def load() -> dict[str, Any]:
    """Machine load right now: other people's work on a shared box skews everything."""
    out: dict[str, Any] = {"loadavg": [round(x, 2) for x in os.getloadavg()]}
    with contextlib.suppress(OSError):
        line = Path("/proc/pressure/cpu").read_text().splitlines()[0]
        out["cpu_pressure_some_avg60"] = float(line.split()[2].split("=")[1])
    return out
