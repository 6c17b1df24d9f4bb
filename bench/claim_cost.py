"""What one claim of one due job costs on the latency path: the ``job_claim`` text of
each given revision (``git show REV:deadman/db/queries.sql``; ``.`` is this checkout),
prepared on its own connection with a worker session's settings (db/plans.py), taking
turns job by job on ``--database-url``. Timed on the client: the round trip of the
claim alone. Before each claim one job is inserted (untimed); after it, the job is
finished through job_finish_many (untimed), so the table grows as under a worker.
Bounded: ``--jobs`` claims per revision. Use a migrated database whose schema both
revisions accept (the claim's functions and indexes).

    .venv-bench/bin/python -m bench.claim_cost --database-url postgresql://... 7933ffc .
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import time
from typing import Any, LiteralString

import psycopg
from psycopg.rows import DictRow, dict_row

from bench.common import ROOT
from deadman.db.plans import GENERIC
from deadman.db.queries import QUERIES, parse
from deadman.model import AttemptOutcome, JobState
from deadman.store.leases import ClaimParams, Finish, claim_params, finish_params

WARMUP = 50


def claim_text(rev: str) -> LiteralString:
    if rev == ".":
        return QUERIES["job_claim"]
    text = subprocess.run(
        ["git", "show", f"{rev}:deadman/db/queries.sql"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return parse(text)["job_claim"]


def run(dsn: str, revs: list[str], jobs: int) -> dict[str, list[float]]:
    texts = {rev: claim_text(rev) for rev in revs}
    params: dict[str, Any] = claim_params(ClaimParams("default", "bench-claim", 5, 30_000))
    times: dict[str, list[float]] = {rev: [] for rev in revs}
    conns: dict[str, psycopg.Connection[DictRow]] = {
        rev: psycopg.connect(
            dsn, options=GENERIC, autocommit=True, row_factory=dict_row, prepare_threshold=0
        )
        for rev in revs
    }
    try:
        with psycopg.connect(dsn, autocommit=True) as inserter:
            for i in range(jobs + WARMUP):
                turn = revs[i % len(revs) :] + revs[: i % len(revs)]
                for rev in turn:
                    inserter.execute("INSERT INTO deadman.jobs (type) VALUES ('noop')")
                    t0 = time.perf_counter()
                    rows = conns[rev].execute(texts[rev], params).fetchall()
                    elapsed = (time.perf_counter() - t0) * 1e6
                    taken = [r for r in rows if r["id"] is not None]
                    if len(taken) != 1:
                        raise AssertionError(f"{rev}: claimed {len(taken)} jobs, expected 1")
                    if i >= WARMUP:
                        times[rev].append(elapsed)
                    done = Finish(
                        int(taken[0]["id"]),
                        int(taken[0]["lease_token"]),
                        JobState.SUCCEEDED,
                        AttemptOutcome.SUCCEEDED,
                    )
                    conns[rev].execute(QUERIES["job_finish_many"], finish_params([done]))
    finally:
        for conn in conns.values():
            conn.close()
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--database-url", required=True)
    ap.add_argument("--jobs", type=int, default=500)
    ap.add_argument("revs", nargs="+", help="git revisions; '.' is this checkout")
    args = ap.parse_args()
    for rev, t in run(args.database_url, args.revs, args.jobs).items():
        t.sort()
        print(
            f"{rev:>12}  claims {len(t)}  median {statistics.median(t):,.0f} µs"
            f"  p10 {t[len(t) // 10]:,.0f}  p90 {t[9 * len(t) // 10]:,.0f}"
        )


if __name__ == "__main__":
    main()
