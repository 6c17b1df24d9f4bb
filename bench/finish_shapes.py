"""What a finish costs Postgres, by where a finished job goes: issue 16's direction
"finished jobs leave the hot table for a history table", measured before building it.

On a fresh durable cluster of its own (deadman's schema, migrated), rounds of
``--cycles`` cycles of ``--batch`` jobs: queue the round's jobs (untimed), then in
each cycle claim ``--batch`` of them (job_claim's unkeyed claim: ``FOR UPDATE SKIP
LOCKED`` and ``deadman.job_start``) and finish them with one of three statements, the shapes
taking turns (each goes first in every third round):

- ``update``: ``job_finish_many``, the statement the worker sends today (the row stays
  in ``deadman.jobs`` as succeeded: a new row version and its index entries);
- ``move``: the same lock step, then ``DELETE`` from ``deadman.jobs`` and ``INSERT``
  of the finished row into a history table (``LIKE deadman.jobs``: its columns and
  defaults, no CHECKs, a primary key and an index on ``finished_at`` for retention);
- ``delete``: the lock step and the ``DELETE`` alone, keeping nothing (the floor of
  any shape that moves the row out).

The cost is the CPU of the one backend that runs them (``/proc``, clock ticks), per
job, split into the finishes and the claims; the WAL writer's and autovacuum's share
is not in it. Between rounds the table is vacuumed. Bounded: ``--rounds`` x 3 shapes x
``--cycles`` cycles.

    .venv-bench/bin/python -m bench.finish_shapes --rounds 8
"""

from __future__ import annotations

import argparse
import statistics
from typing import LiteralString

import psycopg

from bench import common
from deadman.db.migrate import migrate
from deadman.db.plans import GENERIC
from deadman.db.queries import QUERIES
from deadman.model import AttemptOutcome, JobState
from deadman.store.leases import ClaimParams, Finish, claim_params, finish_params

_LOCKED: LiteralString = """
    SELECT j.id, j.lease_token FROM deadman.jobs j
    JOIN json_to_recordset(%(batch)s::json) AS i(id bigint, token bigint)
      ON i.id = j.id AND i.token = j.lease_token
    WHERE j.id = ANY(%(ids)s::bigint[])
    ORDER BY j.id
    FOR UPDATE OF j
"""

SHAPES: dict[str, LiteralString] = {
    "update": QUERIES["job_finish_many"],
    "move": "WITH locked AS ("
    + _LOCKED
    + """), gone AS (
        DELETE FROM deadman.jobs j USING locked l
        WHERE j.id = l.id AND j.lease_token = l.lease_token
        RETURNING j.*
    )
    INSERT INTO bench_jobs_history (id, type, queue, priority, state, attempt,
        max_attempts, run_at, created_at, payload, rescues, backoff, timeout_ms,
        started_at, finished_at, lease_worker, finished_token, limit_key)
    SELECT id, type, queue, priority, 'succeeded', attempt, max_attempts, run_at,
        created_at, payload, rescues, backoff, timeout_ms, started_at, now(),
        lease_worker, lease_token, limit_key
    FROM gone""",
    "delete": "WITH locked AS ("
    + _LOCKED
    + """)
    DELETE FROM deadman.jobs j USING locked l
    WHERE j.id = l.id AND j.lease_token = l.lease_token""",
}

HISTORY: list[LiteralString] = [
    "DROP TABLE IF EXISTS bench_jobs_history",
    "CREATE TABLE bench_jobs_history (LIKE deadman.jobs INCLUDING DEFAULTS)",
    "ALTER TABLE bench_jobs_history ADD PRIMARY KEY (id)",
    "CREATE INDEX ON bench_jobs_history (finished_at)",
]


def run(dsn: str, rounds: int, cycles: int, batch: int) -> dict[str, list[tuple[float, float]]]:
    """Per shape, one (finish, claim) pair of backend µs per job for each round."""
    params = claim_params(ClaimParams("default", "bench-finish", batch, 30_000, keyed=False))
    found: dict[str, list[tuple[float, float]]] = {name: [] for name in SHAPES}
    with psycopg.connect(dsn, autocommit=True, options=GENERIC, prepare_threshold=0) as conn:
        for statement in HISTORY:
            conn.execute(statement)
        pid = int(conn.execute("SELECT pg_backend_pid()").fetchone()[0])  # type: ignore[index]
        names = list(SHAPES)
        for r in range(rounds):
            for name in names[r % 3 :] + names[: r % 3]:  # each shape first in turn
                finish = SHAPES[name]
                conn.execute(
                    "INSERT INTO deadman.jobs (type) SELECT 'noop' FROM generate_series(1, %s)",
                    (cycles * batch,),
                )
                finishing = claiming = 0.0
                for _ in range(cycles):
                    t0 = common.process_cpu_s(pid)
                    cur = conn.execute(QUERIES["job_claim"], params)
                    rows = cur.fetchall()
                    t1 = common.process_cpu_s(pid)
                    columns = [c.name for c in cur.description or ()]
                    at_id, at_token = columns.index("id"), columns.index("lease_token")
                    done = [
                        Finish(
                            int(r[at_id]),
                            int(r[at_token]),
                            JobState.SUCCEEDED,
                            AttemptOutcome.SUCCEEDED,
                        )
                        for r in rows
                        if r[at_id] is not None
                    ]
                    if len(done) != batch:
                        raise AssertionError(f"{name}: claimed {len(done)}, expected {batch}")
                    conn.execute(finish, finish_params(done))
                    finishing += common.process_cpu_s(pid) - t1
                    claiming += t1 - t0
                left = conn.execute(
                    "SELECT count(*) FROM deadman.jobs WHERE state <> 'succeeded'"
                ).fetchone()
                if left is None or left[0] != 0:
                    raise AssertionError(f"{name}: {left} jobs not finished")
                n = cycles * batch
                found[name].append((finishing / n * 1e6, claiming / n * 1e6))
                print(
                    f"{name:>7}  finish {found[name][-1][0]:5.1f} µs/job"
                    f"  claim {found[name][-1][1]:5.1f}",
                    flush=True,
                )
                conn.execute("VACUUM deadman.jobs")
    return found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--cycles", type=int, default=200)
    ap.add_argument("--batch", type=int, default=100)
    args = ap.parse_args()
    with common.durable_cluster() as cluster:
        dsn = common.create_database(cluster, "finish_shapes")
        migrate(dsn)
        found = run(dsn, args.rounds, args.cycles, args.batch)
    for name, pairs in found.items():
        finishes = sorted(round(f, 1) for f, _ in pairs)
        claims = sorted(round(c, 1) for _, c in pairs)
        print(
            f"{name:>7}  finish median {statistics.median(finishes):5.1f} µs/job {finishes}"
            f"  claim median {statistics.median(claims):5.1f} {claims}"
        )


if __name__ == "__main__":
    main()
