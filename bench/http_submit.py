"""HTTP submissions per second over keep-alive connections (issue 3's benchmark).

Starts a durable private cluster and ``deadman serve`` on 127.0.0.1, then for
``--seconds`` each: ``--clients`` threads, each with one keep-alive httpx client,
POST /jobs as fast as the answers come back — once without and once with an
Idempotency-Key (a new key per job) — and POST /jobs/batch with 100 jobs per request.
No worker runs: this measures submission only. Afterwards it checks that every
acknowledged job is in the database exactly once.

    .venv-bench/bin/python -m bench.http_submit --seconds 10 --clients 8

Prints a table and writes bench/results/http-<time>.json.
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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_phase(base: str, seconds: float, clients: int, mode: str) -> dict[str, Any]:
    """One phase; returns acknowledged ids, request count and elapsed time."""
    ids: list[str] = []
    errors: list[int] = []
    lock = threading.Lock()
    deadline = time.monotonic() + seconds

    def client() -> None:
        mine: list[str] = []
        bad: list[int] = []
        with httpx.Client(base_url=base, timeout=10.0) as http:
            while time.monotonic() < deadline:
                if mode == "batch":
                    body: Any = {"jobs": [{"type": "noop"} for _ in range(100)]}
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--clients", type=int, default=8)
    args = parser.parse_args()
    results: list[dict[str, Any]] = []
    with common.durable_cluster() as cluster:
        dsn = common.create_database(cluster, "http_bench")
        migrate(dsn)
        port = free_port()
        out = Path("bench/results")
        out.mkdir(parents=True, exist_ok=True)
        log = out / "http-serve.log"
        server = common.spawn(
            [sys.executable, "-m", "deadman", "serve", "--port", str(port), "--database-url", dsn],
            log,
        )
        try:
            base = f"http://127.0.0.1:{port}"

            def ready() -> bool:
                try:
                    return httpx.get(base + "/ready", timeout=1.0).status_code == 200
                except httpx.HTTPError:
                    return False

            common.wait_for(ready, 30.0, "deadman serve ready")
            for mode in ("plain", "keyed", "batch"):
                phase = run_phase(base, args.seconds, args.clients, mode)
                with psycopg.connect(dsn) as conn:
                    row = conn.execute(
                        "SELECT count(*), count(DISTINCT id) FROM deadman.jobs"
                        " WHERE id = ANY(%s::bigint[])",
                        [[int(i) for i in phase["ids"]]],
                    ).fetchone()
                assert row is not None
                acked = len(phase["ids"])
                if row[0] != acked or row[1] != acked:
                    raise SystemExit(f"{mode}: {acked} acknowledged but {row[0]} found")
                results.append(
                    {
                        "mode": mode,
                        "acknowledged": acked,
                        "requests_per_s": (acked / (100 if mode == "batch" else 1))
                        / phase["elapsed_s"],
                        "jobs_per_s": acked / phase["elapsed_s"],
                        "non_201": len(phase["errors"]),
                        "elapsed_s": phase["elapsed_s"],
                    }
                )
            machine = common.machine(dsn)
        finally:
            common.stop(server)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    doc = {"clients": args.clients, "seconds": args.seconds, "results": results, "machine": machine}
    (out / f"http-{stamp}.json").write_text(json.dumps(doc, indent=2, default=str))
    print(f"{'mode':<8} {'jobs/s':>9} {'requests/s':>11} {'acknowledged':>13} {'non-201':>8}")
    for r in results:
        print(
            f"{r['mode']:<8} {r['jobs_per_s']:>9.0f} {r['requests_per_s']:>11.0f} "
            f"{r['acknowledged']:>13} {r['non_201']:>8}"
        )


if __name__ == "__main__":
    main()
