"""HTTP submissions per second over keep-alive connections (issue 5's HTTP target).

Starts ``deadman serve`` (one process, one uvicorn worker) on 127.0.0.1 against a
fresh database, then for ``seconds`` each: ``clients`` threads, each with one
keep-alive httpx client, POST /jobs as fast as the answers come back — once without
and once with an Idempotency-Key (a new key per job) — and POST /jobs/batch with
100 jobs per request. No worker runs: this measures submission only. After each
mode it checks that every acknowledged job is in the database exactly once and that
the table holds no job that was not acknowledged; anything else fails the phase.

Part of ``python -m bench.run`` (phase ``http``); standalone, on its own cluster:

    .venv-bench/bin/python -m bench.http_submit --seconds 10 --clients 8
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import threading
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import psycopg

from bench import common
from deadman.db.migrate import migrate

MODES = ("plain", "keyed", "batch")
BATCH = 100
MODE_LABELS = {
    "plain": "`POST /jobs`, no Idempotency-Key",
    "keyed": "`POST /jobs` with a new Idempotency-Key each",
    "batch": f"`POST /jobs/batch`, {BATCH} jobs per request",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_mode(base: str, seconds: float, clients: int, mode: str) -> dict[str, Any]:
    """One mode for ``seconds``; returns acknowledged ids, non-201 codes, elapsed time.
    Bounded in time (each client stops at the deadline; requests time out at 10 s) and
    in count."""
    ids: list[str] = []
    errors: list[int] = []
    lock = threading.Lock()
    deadline = time.monotonic() + seconds
    max_requests = int(seconds * 10_000)  # per client; far above what one server answers

    def client() -> None:
        mine: list[str] = []
        bad: list[int] = []
        with httpx.Client(base_url=base, timeout=10.0) as http:
            for _ in range(max_requests):
                if time.monotonic() >= deadline:
                    break
                if mode == "batch":
                    body: Any = {"jobs": [{"type": "noop"} for _ in range(BATCH)]}
                    r = http.post("/jobs/batch", json=body)
                    if r.status_code == 201:
                        mine.extend(j["id"] for j in r.json()["jobs"])
                    else:
                        bad.append(r.status_code)
                    continue
                headers = {"Idempotency-Key": uuid.uuid4().hex} if mode == "keyed" else {}
                r = http.post("/jobs", json={"type": "noop"}, headers=headers)
                if r.status_code == 201:
                    mine.append(r.json()["id"])
                else:
                    bad.append(r.status_code)
        with lock:
            ids.extend(mine)
            errors.extend(bad)

    started = time.monotonic()
    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - started
    return {"mode": mode, "ids": ids, "errors": errors, "elapsed_s": elapsed}


def run(dsn: str, seconds: float, clients: int, logdir: Path) -> dict[str, Any]:
    """All three modes against one ``deadman serve`` on ``dsn`` (migrated here)."""
    migrate(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("TRUNCATE deadman.jobs RESTART IDENTITY CASCADE")
    port = free_port()
    server = common.spawn(
        [sys.executable, "-m", "deadman", "serve", "--port", str(port), "--database-url", dsn],
        logdir / "http-serve.log",
        {"DEADMAN_LOG_LEVEL": "warning"},
    )
    results: list[dict[str, Any]] = []
    acked_total = 0
    try:
        base = f"http://127.0.0.1:{port}"

        def ready() -> bool:
            if server.poll() is not None:
                raise RuntimeError(f"deadman serve exited with {server.returncode}")
            try:
                return httpx.get(base + "/ready", timeout=1.0).status_code == 200
            except httpx.HTTPError:
                return False

        common.wait_for(ready, 30.0, "deadman serve ready", every=0.2)
        for mode in MODES:
            phase = run_mode(base, seconds, clients, mode)
            acked = len(phase["ids"])
            acked_total += acked
            with psycopg.connect(dsn) as conn:
                row = conn.execute(
                    "SELECT count(*), count(DISTINCT id) FROM deadman.jobs"
                    " WHERE id = ANY(%s::bigint[])",
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
                "acknowledged_so_far": acked_total,
                "non_201": len(phase["errors"]),
                "non_201_codes": sorted(set(phase["errors"])),
                # every acknowledged job stored once, nothing stored that was not
                # acknowledged, and no request refused
                "ok": found == distinct == acked
                and rows_total == acked_total
                and not phase["errors"]
                and acked > 0,
            }
            per_request = BATCH if mode == "batch" else 1
            results.append(
                {
                    "mode": mode,
                    "label": MODE_LABELS[mode],
                    "acknowledged": acked,
                    "requests_per_s": round(acked / per_request / phase["elapsed_s"], 1),
                    "jobs_per_s": round(acked / phase["elapsed_s"], 1),
                    "non_201": len(phase["errors"]),
                    "elapsed_s": round(phase["elapsed_s"], 3),
                    "verify": verify,
                    "ok": verify["ok"],
                }
            )
    finally:
        common.stop(server)
    return {
        "clients": clients,
        "seconds": seconds,
        "server": "one `deadman serve` process (one uvicorn worker), no job workers",
        "results": results,
        "ok": len(results) == len(MODES) and all(r["ok"] for r in results),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--clients", type=int, default=8)
    args = parser.parse_args()
    out = common.ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    with common.durable_cluster() as cluster:
        dsn = common.create_database(cluster, "http_bench")
        doc = run(dsn, args.seconds, args.clients, out)
        doc["machine"] = common.machine(dsn)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    (out / f"http-{stamp}.json").write_text(json.dumps(doc, indent=2, default=str))
    print(f"{'mode':<8} {'jobs/s':>9} {'requests/s':>11} {'acknowledged':>13} {'non-201':>8} ok")
    for r in doc["results"]:
        print(
            f"{r['mode']:<8} {r['jobs_per_s']:>9.0f} {r['requests_per_s']:>11.0f} "
            f"{r['acknowledged']:>13} {r['non_201']:>8} {r['ok']}"
        )
    if not doc["ok"]:
        raise SystemExit("verification failed")


if __name__ == "__main__":
    main()
