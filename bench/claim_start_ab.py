"""job_claim as shipped against the same claim with deadman.job_start's UPDATE written
out in it (DECISIONS "Not adopted: job_start written out in the claims"):

    python -m bench.claim_start_ab --database-url postgresql://.../scratch --cycles 1500

One job per claim (the latency path and concurrency 1), the two statements alternating
on one connection with the worker's session options (generic plans, prepared at once),
timed on the client; the job is enqueued before each claim and finished after it, both
untimed, on a second connection. Writes deadman.jobs in the database it is given: point
it at a scratch database (``deadman migrate`` first).
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any, LiteralString, cast

import psycopg
from psycopg.rows import dict_row

from deadman.db.plans import GENERIC
from deadman.db.queries import QUERIES

WRITTEN_OUT = """), claimed AS (
    UPDATE deadman.jobs j
    SET state = 'running',
        attempt = j.attempt + 1,
        lease_token = nextval('deadman.lease_token_seq'),
        lease_worker = %(worker)s::text,
        lease_expires_at = now() + %(ttl_ms)s::bigint * interval '1 millisecond',
        started_at = now()
    WHERE j.id = ANY (ARRAY(SELECT id FROM candidates ORDER BY priority DESC, run_at, id
                            LIMIT %(limit)s - (SELECT count(*) FROM keyed)))
    RETURNING j.*
)
"""


def written_out() -> LiteralString:
    shipped = QUERIES["job_claim"]
    start, end = shipped.index("), claimed AS ("), shipped.index("SELECT * FROM keyed")
    return cast(LiteralString, shipped[:start] + WRITTEN_OUT + shipped[end:])  # type: ignore[redundant-cast]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--database-url", required=True)
    ap.add_argument("--cycles", type=int, default=1500)
    args = ap.parse_args()
    variants = {"job_start (shipped)": QUERIES["job_claim"], "written out": written_out()}
    params: dict[str, Any] = {
        "queue": "claim-start-ab",
        "worker": "claim-start-ab",
        "ttl_ms": 30_000,
        "limit": 1,
        "keyed": True,
        "quarantine_at": 3,
    }
    times: dict[str, list[float]] = {name: [] for name in variants}
    with (
        psycopg.connect(
            args.database_url,
            autocommit=True,
            row_factory=dict_row,
            options=GENERIC,
            prepare_threshold=0,
        ) as conn,
        psycopg.connect(args.database_url, autocommit=True) as admin,
    ):
        for _ in range(args.cycles):
            for name, sql in variants.items():
                admin.execute(
                    "INSERT INTO deadman.jobs (type, queue) VALUES ('noop', 'claim-start-ab')"
                )
                t0 = time.perf_counter()
                rows = conn.execute(sql, params).fetchall()
                times[name].append((time.perf_counter() - t0) * 1e3)
                if len(rows) != 1 or rows[0]["state"] != "running":
                    raise AssertionError(f"{name} claimed {rows}")
                admin.execute(
                    "UPDATE deadman.jobs SET state = 'succeeded', finished_at = now(),"
                    " lease_token = NULL, lease_expires_at = NULL WHERE id = %s",
                    (rows[0]["id"],),
                )
    for name, ms in times.items():
        ms = ms[20:]  # the first cycles prepare and warm up
        print(
            f"{name}: claim of one job p50 {statistics.median(ms):.3f} ms,"
            f" mean {statistics.mean(ms):.3f}, p90 {statistics.quantiles(ms, n=10)[-1]:.3f}"
        )


if __name__ == "__main__":
    main()
