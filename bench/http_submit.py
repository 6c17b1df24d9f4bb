"""HTTP submissions per second over keep-alive connections (issue 5's HTTP target).

Starts ``deadman serve`` (one process, one uvicorn worker) on 127.0.0.1 against a
fresh database, then for ``seconds`` each: ``clients`` threads, each with one
keep-alive connection (a plain socket client by default, ``--client httpx`` for httpx),
POST /jobs as fast as the answers come back — once without
and once with an Idempotency-Key (a new key per job) — and POST /jobs/batch with
100 jobs per request. No worker runs: this measures submission only. After each
mode it checks that every acknowledged job is in the database exactly once and that
the table holds no job that was not acknowledged; anything else fails the phase.

The client threads run on the same two cores as the server and Postgres, so each
mode also says where the CPU went: cores used by the server, Postgres, this
harness (the clients) and everything else on the box, and CPU µs per job.

Part of ``python -m bench.run`` (phase ``http``); standalone, on its own cluster:

    .venv-bench/bin/python -m bench.http_submit --seconds 10 --clients 8
    .venv-bench/bin/python -m bench.http_submit --modes keyed --profile /tmp/serve.txt
    .venv-bench/bin/python -m bench.http_submit --base main --reps 3 --modes keyed
    .venv-bench/bin/python -m bench.http_submit --modes keyed --servers 2

``--base REV`` is a before/after: the server of that revision (a ``git worktree``)
and of this checkout take turns, rep by rep, on one cluster, so a busy machine slows
both alike; the harness (clients, verification) is this checkout's for both.
``--servers N`` runs N server processes on the one database and deals the clients out
among them, as a balancer in front of them would (without the balancer's own cost).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import psycopg
from prometheus_client.parser import text_string_to_metric_families

from bench import common
from deadman.db.migrate import migrate

MODES = ("plain", "keyed", "keyed_many", "batch")
BATCH = 100
#: Clients of the "keyed_many" mode: enough that the one server process is the
#: bottleneck (at 8, each request mostly waits for its group's WAL flush; measured
#: 8 / 32 / 64 clients: the server's CPU reaches ~0.95 of a core only at 64).
MANY_CLIENTS = 64
MODE_LABELS = {
    "plain": "`POST /jobs`, no Idempotency-Key",
    "keyed": "`POST /jobs` with a new Idempotency-Key each",
    "keyed_many": f"`POST /jobs` with a new Idempotency-Key each, {MANY_CLIENTS} clients",
    "batch": f"`POST /jobs/batch`, {BATCH} jobs per request",
}
#: cpu_snapshot's kinds, as this bench names them
CPU_KINDS = {"workers": "server", "postgres": "postgres", "bench": "clients", "other": "others"}


def clients_of(mode: str, clients: int) -> int:
    """How many clients a mode runs: ``clients``, or MANY_CLIENTS for keyed_many."""
    return MANY_CLIENTS if mode == "keyed_many" else clients


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_mode(
    bases: tuple[str, ...], seconds: float, clients: int, mode: str, client: str = "raw"
) -> dict[str, Any]:
    """One mode for ``seconds``; returns acknowledged ids, non-201 codes, elapsed time.
    Bounded in time (each client stops at the deadline; requests time out at 10 s) and
    in count. ``client``: "raw" (see RawHttp) or "httpx". Client i talks to server
    ``bases[i % len(bases)]`` (more than one: servers behind a balancer, minus its
    cost)."""
    ids: list[str] = []
    errors: list[int] = []
    lock = threading.Lock()
    deadline = time.monotonic() + seconds
    max_requests = int(seconds * 20_000)  # per client; far above what one server answers
    batch_body = json.dumps({"jobs": [{"type": "noop"} for _ in range(BATCH)]}).encode()

    def one_client(base: str) -> None:
        mine: list[str] = []
        bad: list[int] = []
        http: RawHttp | HttpxHttp = RawHttp(base) if client == "raw" else HttpxHttp(base)
        try:
            for _ in range(max_requests):
                if time.monotonic() >= deadline:
                    break
                if mode == "batch":
                    status, doc = http.post("/jobs/batch", batch_body, None)
                    if status == 201:
                        mine.extend(j["id"] for j in doc["jobs"])
                    else:
                        bad.append(status)
                    continue
                key = uuid.uuid4().hex if mode in ("keyed", "keyed_many") else None
                status, doc = http.post("/jobs", b'{"type":"noop"}', key)
                if status == 201:
                    mine.append(doc["id"])
                else:
                    bad.append(status)
        finally:
            http.close()
        with lock:
            ids.extend(mine)
            errors.extend(bad)

    started = time.monotonic()
    threads = [
        threading.Thread(target=one_client, args=(bases[i % len(bases)],)) for i in range(clients)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - started
    return {"mode": mode, "ids": ids, "errors": errors, "elapsed_s": elapsed}


class RawHttp:
    """One keep-alive HTTP/1.1 connection over a plain socket, one request at a time
    (no pipelining): what httpx does for this bench, at a fraction of its CPU. httpx
    spent about 570 µs of CPU per request here, on the same two cores as the server,
    which capped the whole bench near 1,700 requests/s whatever the server did.
    Understands exactly what deadman serve sends: a status line, headers with a
    Content-Length, a JSON body."""

    def __init__(self, base: str) -> None:
        host, _, port = base.removeprefix("http://").partition(":")
        self._host = host.encode()
        self._sock = socket.create_connection((host, int(port)), timeout=10.0)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._buf = b""

    def post(self, path: str, body: bytes, key: str | None) -> tuple[int, Any]:
        head = (
            b"POST "
            + path.encode()
            + b" HTTP/1.1\r\nHost: "
            + self._host
            + b"\r\nContent-Type: application/json\r\nContent-Length: "
            + str(len(body)).encode()
            + b"\r\n"
        )
        if key is not None:
            head += b"Idempotency-Key: " + key.encode() + b"\r\n"
        self._sock.sendall(head + b"\r\n" + body)
        while (end := self._buf.find(b"\r\n\r\n")) < 0:
            self._fill()
        lines = self._buf[:end].split(b"\r\n")
        status = int(lines[0].split(b" ", 2)[1])
        length = 0
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        self._buf = self._buf[end + 4 :]
        while len(self._buf) < length:
            self._fill()
        raw, self._buf = self._buf[:length], self._buf[length:]
        return status, json.loads(raw) if raw else None

    def _fill(self) -> None:
        chunk = self._sock.recv(65536)
        if not chunk:
            raise ConnectionError("the server closed the connection")
        self._buf += chunk

    def close(self) -> None:
        self._sock.close()


class HttpxHttp:
    """The same over httpx (the bench's client until the raw one)."""

    def __init__(self, base: str) -> None:
        self._http = httpx.Client(base_url=base, timeout=10.0)

    def post(self, path: str, body: bytes, key: str | None) -> tuple[int, Any]:
        headers = {"Content-Type": "application/json"}
        if key is not None:
            headers["Idempotency-Key"] = key
        r = self._http.post(path, content=body, headers=headers)
        return r.status_code, r.json()

    def close(self) -> None:
        self._http.close()


def serve(dsn: str, log: Path, tree: Path = common.ROOT) -> tuple[subprocess.Popen[bytes], str]:
    """``deadman serve`` from ``tree`` on a free port, once /ready says 200."""
    port = free_port()
    handle = log.open("ab")
    server = subprocess.Popen(
        [sys.executable, "-m", "deadman", "serve", "--port", str(port), "--database-url", dsn],
        stdout=handle,
        stderr=subprocess.STDOUT,
        env=dict(os.environ, PYTHONPATH=str(tree), DEADMAN_LOG_LEVEL="warning"),
        cwd=tree,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        if server.poll() is not None:
            raise RuntimeError(f"deadman serve exited with {server.returncode}")
        try:
            return httpx.get(base + "/ready", timeout=1.0).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        common.wait_for(ready, 30.0, "deadman serve ready", every=0.2)
    except BaseException:
        common.stop(server)
        raise
    return server, base


def measure(
    dsn: str,
    servers: list[subprocess.Popen[bytes]],
    bases: tuple[str, ...],
    mode: str,
    seconds: float,
    clients: int,
    acked_before: int,
    profile: Path | None = None,
    client: str = "raw",
) -> dict[str, Any]:
    """One mode against running servers (one, or several sharing the clients), with the
    CPU split (the servers' together) and the verification: every acknowledged id
    stored once, no row that was not acknowledged. py-spy samples the first server."""
    pids = [s.pid for s in servers]
    spy = _py_spy(pids[0], profile) if profile is not None else None
    groups0 = [group_commits(b) for b in bases]
    try:
        cpu0 = common.cpu_snapshot(pids)
        phase = run_mode(bases, seconds, clients, mode, client)
        cores = common.cpu_used(cpu0, phase["elapsed_s"], pids)
    finally:
        if spy is not None:
            spy.send_signal(signal.SIGINT)
            spy.wait(30)
    groups1 = [group_commits(b) for b in bases]
    groups = sum(after[0] - before[0] for after, before in zip(groups1, groups0, strict=True))
    grouped = sum(after[1] - before[1] for after, before in zip(groups1, groups0, strict=True))
    acked = len(phase["ids"])
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT count(*), count(DISTINCT id) FROM deadman.jobs WHERE id = ANY(%s::bigint[])",
            [[int(i) for i in phase["ids"]]],
        ).fetchone()
        total = conn.execute("SELECT count(*) FROM deadman.jobs").fetchone()
    assert row is not None and total is not None
    found, distinct, rows_total = int(row[0]), int(row[1]), int(total[0])
    verify = {
        "acknowledged": acked,
        "found": found,
        "distinct": distinct,
        "rows_in_table": rows_total,
        "acknowledged_so_far": acked_before + acked,
        "non_201": len(phase["errors"]),
        "non_201_codes": sorted(set(phase["errors"])),
        # every acknowledged job stored once, nothing stored that was not
        # acknowledged, and no request refused
        "ok": found == distinct == acked
        and rows_total == acked_before + acked
        and not phase["errors"]
        and acked > 0,
    }
    per_request = BATCH if mode == "batch" else 1
    cpu = {name: cores.get(kind, 0.0) for kind, name in CPU_KINDS.items()}
    return {
        "mode": mode,
        "label": MODE_LABELS[mode],
        "clients": clients,
        "servers": len(servers),
        "acknowledged": acked,
        "requests_per_s": round(acked / per_request / phase["elapsed_s"], 1),
        "jobs_per_s": round(acked / phase["elapsed_s"], 1),
        "non_201": len(phase["errors"]),
        "elapsed_s": round(phase["elapsed_s"], 3),
        # cores used on average over the mode, and CPU µs per acknowledged job
        "cpu_cores": cpu,
        "cpu_us_per_job": {
            k: round(v * phase["elapsed_s"] / acked * 1e6, 1) if acked else None
            for k, v in cpu.items()
        },
        # POST /jobs's group commits during the mode (deadman_api_group_commit_size):
        # how many statements wrote the single submissions, and their mean size
        "group_commits": groups,
        "mean_group": round(grouped / groups, 2) if groups else None,
        "verify": verify,
        "ok": verify["ok"],
    }


def group_commits(base: str) -> tuple[int, int]:
    """The server's group commits so far and the submissions they wrote, from its
    /metrics (deadman_api_group_commit_size's count and sum)."""
    text = httpx.get(base + "/metrics", timeout=10.0).text
    name = "deadman_api_group_commit_size"
    found = {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        if family.name == name
        for sample in family.samples
    }
    return int(found.get(f"{name}_count", 0)), int(found.get(f"{name}_sum", 0))


def _py_spy(pid: int, out: Path) -> subprocess.Popen[bytes]:
    spy = Path(sys.executable).with_name("py-spy")
    argv = [str(spy), "record", "--pid", str(pid), "--rate", "250", "--format", "raw"]
    argv += ["--output", str(out), "--nonblocking"]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.0)  # py-spy attaches
    return proc


def _reset(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("TRUNCATE deadman.jobs RESTART IDENTITY CASCADE")


def run(
    dsn: str,
    seconds: float,
    clients: int,
    logdir: Path,
    modes: tuple[str, ...] = MODES,
    profile: Path | None = None,
    client: str = "raw",
    reps: int = 1,
    servers: int = 1,
) -> dict[str, Any]:
    """``modes`` against ``servers`` ``deadman serve`` processes (one, as issue 16's
    target says, unless asked) on ``dsn`` (migrated here), the clients dealt out among
    them, ``reps`` rounds of them, every other round in reverse order, so that a slow
    spell of the box falls on every mode alike; each mode's row is its median round's,
    with every round's jobs/s beside it (``rounds_jobs_per_s``) and ``ok`` only if
    every round verified. With ``profile``, py-spy samples the first server during the
    first round's keyed mode into that file."""
    migrate(dsn)
    _reset(dsn)
    started: list[subprocess.Popen[bytes]] = []
    bases: list[str] = []
    rounds: dict[str, list[dict[str, Any]]] = {mode: [] for mode in modes}
    acked_total = 0
    try:
        for i in range(servers):
            # a log of its own each: lines two servers append to one file cannot be told apart
            name = "http-serve.log" if i == 0 else f"http-serve-{i + 1}.log"
            server, base = serve(dsn, logdir / name)
            started.append(server)
            bases.append(base)
        for rep in range(reps):
            for mode in modes if rep % 2 == 0 else tuple(reversed(modes)):
                spy = profile if mode == "keyed" and rep == 0 else None
                n = clients_of(mode, clients)
                r = measure(dsn, started, tuple(bases), mode, seconds, n, acked_total, spy, client)
                acked_total += r["acknowledged"]
                rounds[mode].append(r)
    finally:
        for server in started:
            common.stop(server)
    results = [median_round(rounds[mode]) for mode in modes if rounds[mode]]
    return {
        "clients": clients,
        "client": client,
        "seconds": seconds,
        "reps": reps,
        "server": (
            "one `deadman serve` process (one uvicorn worker), no job workers"
            if servers == 1
            else f"{servers} `deadman serve` processes, the clients dealt out among them,"
            " no job workers"
        ),
        "results": results,
        "ok": len(results) == len(modes) and all(r["ok"] for r in results),
    }


def median_round(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """A mode's row: its median round by jobs/s (the lower of the middle two for an
    even count), every round's jobs/s, and ok only if every round verified."""
    ranked = sorted(rounds, key=lambda r: r["jobs_per_s"])
    row = dict(ranked[(len(ranked) - 1) // 2])
    row["rounds_jobs_per_s"] = [r["jobs_per_s"] for r in rounds]
    row["ok"] = all(r["ok"] for r in rounds)
    return row


def ab(
    cluster: Any,
    base_rev: str,
    reps: int,
    seconds: float,
    clients: int,
    modes: tuple[str, ...],
    logdir: Path,
    client: str = "raw",
) -> dict[str, Any]:
    """``base_rev``'s server and this checkout's, alternating, ``reps`` times each; each
    side on its own database of ``cluster``, migrated by its own tree, emptied before
    each of its servers starts."""
    keep: list[Path] = []
    runs: list[dict[str, Any]] = []
    try:
        base_tree, base_commit = common.revision_tree(base_rev, keep)
        this_tree, this_commit = common.revision_tree(".", keep)
        sides = {"base": (base_tree, base_commit), "this": (this_tree, this_commit)}
        dsns = {side: common.create_database(cluster, f"http_ab_{side}") for side in sides}
        for side, (tree, _) in sides.items():
            subprocess.run(
                [sys.executable, "-m", "deadman", "migrate", "--database-url", dsns[side]],
                env=dict(os.environ, PYTHONPATH=str(tree)),
                cwd=tree,
                check=True,
                capture_output=True,
            )
        for rep in range(reps):
            order = ("base", "this") if rep % 2 == 0 else ("this", "base")
            for side in order:
                tree, commit = sides[side]
                dsn = dsns[side]
                _reset(dsn)
                server, url = serve(dsn, logdir / f"http-serve-{side}.log", tree)
                try:
                    acked = 0
                    for mode in modes:
                        n = clients_of(mode, clients)
                        r = measure(dsn, [server], (url,), mode, seconds, n, acked, client=client)
                        acked += r["acknowledged"]
                        runs.append({"side": side, "commit": commit, "rep": rep, **r})
                        print(
                            f"rep {rep} {side:<4} {commit:<16} {mode:<6} "
                            f"{r['jobs_per_s']:>9.0f} jobs/s  cores {r['cpu_cores']}  "
                            f"ok={r['ok']}",
                            flush=True,
                        )
                finally:
                    common.stop(server)
    finally:
        common.remove_trees(keep)
    summary = {
        side: {
            mode: common.median(
                [r["jobs_per_s"] for r in runs if r["side"] == side and r["mode"] == mode]
            )
            for mode in modes
        }
        for side in ("base", "this")
    }
    return {
        "base": base_rev,
        "clients": clients,
        "client": client,
        "seconds": seconds,
        "reps": reps,
        "runs": runs,
        "median_jobs_per_s": summary,
        "ok": all(r["ok"] for r in runs),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument(
        "--modes",
        default=",".join(MODES),
        help=f"comma-separated, of {', '.join(MODES)} (default: all)",
    )
    parser.add_argument("--profile", type=Path, help="py-spy (raw) of the server, keyed mode")
    parser.add_argument("--base", help="before/after against this revision's server")
    parser.add_argument("--reps", type=int, default=3, help="with --base: runs per side")
    parser.add_argument(
        "--servers",
        type=int,
        default=1,
        help="server processes sharing the clients (not with --base; issue 16's target is 1)",
    )
    parser.add_argument(
        "--client", choices=("raw", "httpx"), default="raw", help="the load's HTTP client"
    )
    args = parser.parse_args()
    modes = tuple(m for m in args.modes.split(",") if m)
    if not modes or set(modes) - set(MODES):
        parser.error(f"--modes: choose from {', '.join(MODES)}")
    if args.servers < 1 or (args.base and args.servers != 1):
        parser.error("--servers: 1 or more, and only without --base")
    out = common.ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    with common.durable_cluster() as cluster:
        dsn = common.create_database(cluster, "http_bench")
        if args.base:
            doc = ab(
                cluster, args.base, args.reps, args.seconds, args.clients, modes, out, args.client
            )
        else:
            doc = run(
                dsn,
                args.seconds,
                args.clients,
                out,
                modes,
                args.profile,
                args.client,
                servers=args.servers,
            )
        doc["machine"] = common.machine(dsn)
        doc["load"] = common.load()
    name = "http-ab" if args.base else "http"
    (out / f"{name}-{stamp}.json").write_text(json.dumps(doc, indent=2, default=str))
    if args.base:
        for side, per_mode in doc["median_jobs_per_s"].items():
            print(
                f"median {side}: " + ", ".join(f"{m} {v:.0f} jobs/s" for m, v in per_mode.items())
            )
    else:
        print(
            f"{'mode':<8} {'jobs/s':>9} {'requests/s':>11} {'acknowledged':>13} {'non-201':>8}"
            " ok   cores (server/postgres/clients/others)  mean group"
        )
        for r in doc["results"]:
            c = r["cpu_cores"]
            print(
                f"{r['mode']:<8} {r['jobs_per_s']:>9.0f} {r['requests_per_s']:>11.0f} "
                f"{r['acknowledged']:>13} {r['non_201']:>8} {r['ok']!s:<5}"
                f"{c['server']:.2f}/{c['postgres']:.2f}/{c['clients']:.2f}/{c['others']:.2f}"
                f"  {r['mean_group']}"
            )
    if not doc["ok"]:
        raise SystemExit("verification failed")


if __name__ == "__main__":
    main()
