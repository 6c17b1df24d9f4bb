"""Before/after: what an enqueue call costs the caller, for two revisions of Deadman.

    python -m bench.enqueue_ab --base 8977a05                 # that commit vs this checkout
    python -m bench.enqueue_ab --base 8977a05 --reps 8 --calls 400

Each side runs from its own tree (``git worktree`` for a commit, this checkout for
``.``) with its own migrations, in its own database of one private durable cluster,
as ``bench.ab`` does; the sides take turns rep by rep, and which goes first alternates.
A rep is one process of the side's own code timing ``Client.enqueue`` (``perf_counter``
around the call, paced one call every 4 ms so the connection is never busy) in three
shapes taken in turn, and ``Client.enqueue_many``:

- **handed**: an enqueue on its own while a slot is parked for its queue (the
  handoff at enqueue, DECISIONS 83): the slot is parked again and the handed job
  taken with the side's own statements before the next call;
- **queued**: an enqueue on its own with no slot parked;
- **in_tx**: an enqueue inside the caller's transaction (``conn=``), committed by the
  caller (the commit is timed too);
- **bulk_1000**: ``enqueue_many`` of 1,000 jobs (jobs/s), ``--bulk-calls`` calls a
  rep (12 by default), the median of all but the first two; the jobs are built
  (``Client.job``) before the timing;
- **bulk_1000_built**: the same, each call given a generator of ``Client.job`` calls,
  so building the jobs is timed too (as ``make bench``'s bulk phase times it); one
  such call follows each bulk_1000 call.
- **bulk_1000_keyed**: ``enqueue_many`` of 1,000 jobs, each with a new idempotency
  key, built before the timing; one such call follows each bulk_1000_built call;
- **bulk_1000_keyed_built**: the same, the jobs built inside the timed call (as
  ``make bench``'s keyed bulk builds them); one such call follows each keyed one.

No worker runs: this is the caller's side alone (``bench.run``'s latency phase has the
enqueue → handler path). Raw results: ``bench/results/enqueue-ab-<time>.json``.
"""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from typing import Any

from bench.ab import paired_ratio, rep_order, run_driver, side_arguments, two_sides
from bench.common import median, write_results

SHAPES = (
    "handed",
    "queued",
    "in_tx",
    "bulk_1000",
    "bulk_1000_built",
    "bulk_1000_keyed",
    "bulk_1000_keyed_built",
)

# Run inside the side's tree: its own package, its own statements.
DRIVER = """
import json, statistics, sys, time
import psycopg
from psycopg.rows import dict_row
from deadman.client import Client
from deadman.db.migrate import migrate
from deadman.db.queries import QUERIES
dsn, calls = sys.argv[1], int(sys.argv[2])
bulk_calls = int(sys.argv[4]) if len(sys.argv) > 4 else 12
if sys.argv[3] == "setup":
    migrate(dsn)
    raise SystemExit(0)
# worker_park's parameters as every side's tree names them: "slots" before migration
# 0024, "nonces" since (a statement ignores the ones it does not name)
PARK = {"worker": "enqueue-ab", "queues": ["ab"], "channel": "deadman_handoff_ab",
        "ttl_ms": 60000, "first": 0, "slots": 1, "nonces": [1]}
admin = psycopg.connect(dsn, autocommit=True, row_factory=dict_row)
admin.execute("TRUNCATE deadman.jobs, deadman.attempt_log RESTART IDENTITY CASCADE")
admin.execute("DELETE FROM deadman.parked")
admin.execute("VACUUM ANALYZE deadman.jobs")
theirs = psycopg.connect(dsn)
times = {"handed": [], "queued": [], "in_tx": []}
with Client(dsn) as client:
    client.get(0)
    nxt = time.perf_counter()
    for i in range(calls * 3 + 30):
        shape = ("handed", "queued", "in_tx")[i % 3]
        # nothing due left behind: a queued job would hold the next handoff back
        admin.execute("UPDATE deadman.jobs SET state = 'succeeded', finished_at = now(),"
                      " lease_token = NULL, lease_expires_at = NULL"
                      " WHERE state IN ('queued', 'running')")
        if shape == "handed":
            admin.execute(QUERIES["worker_park"], PARK)
        nxt = max(nxt + 0.004, time.perf_counter())
        while time.perf_counter() < nxt:
            pass
        t = time.perf_counter()
        if shape == "in_tx":
            job = client.enqueue("ab.job", {"i": i}, queue="ab", conn=theirs)
            theirs.commit()
        else:
            job = client.enqueue("ab.job", {"i": i}, queue="ab")
        took = time.perf_counter() - t
        want = "running" if shape == "handed" else "queued"
        assert job.state.value == want, (shape, job.state)
        if shape == "handed":
            admin.execute(QUERIES["job_adopt"], {"worker": PARK["worker"], "job_id": job.id})
        if i >= 30:
            times[shape].append(took * 1000)
    bulk, built, keyed, keyed_built = [], [], [], []
    for rep in range(bulk_calls):
        jobs = [client.job("ab.job", {"i": j}, queue="ab") for j in range(1000)]
        t = time.perf_counter()
        client.enqueue_many(jobs)
        bulk.append(1000 / (time.perf_counter() - t))
        t = time.perf_counter()
        client.enqueue_many(client.job("ab.job", {"i": j}, queue="ab") for j in range(1000))
        built.append(1000 / (time.perf_counter() - t))
        jobs = [client.job("ab.job", {"i": j}, queue="ab", idempotency_key=f"ab-{rep}-{j}")
                for j in range(1000)]
        t = time.perf_counter()
        assert len(client.enqueue_many(jobs)) == 1000
        keyed.append(1000 / (time.perf_counter() - t))
        t = time.perf_counter()
        assert len(client.enqueue_many(
            client.job("ab.job", {"i": j}, queue="ab", idempotency_key=f"ab-built-{rep}-{j}")
            for j in range(1000))) == 1000
        keyed_built.append(1000 / (time.perf_counter() - t))
out = {shape: round(statistics.median(v), 4) for shape, v in times.items()}
out["bulk_1000"] = round(statistics.median(bulk[2:]), 1)
out["bulk_1000_built"] = round(statistics.median(built[2:]), 1)
out["bulk_1000_keyed"] = round(statistics.median(keyed[2:]), 1)
out["bulk_1000_keyed_built"] = round(statistics.median(keyed_built[2:]), 1)
print(json.dumps(out))
"""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    side_arguments(ap)
    ap.add_argument("--calls", type=int, default=300, help="timed calls per shape and rep")
    ap.add_argument("--reps", type=int, default=6, help="even: each side first as often")
    ap.add_argument(
        "--bulk-calls", type=int, default=12, help="enqueue_many calls of 1,000 per rep (>2)"
    )
    ap.add_argument("--out", help="raw JSON path (default bench/results/enqueue-ab-<time>.json)")
    a = ap.parse_args(argv)
    if a.bulk_calls < 3:
        ap.error("--bulk-calls: at least 3 (the first two calls of a rep are not counted)")
    runs: dict[str, list[dict[str, Any]]] = {"before": [], "after": []}
    with two_sides(a.base, a.rev, "enqueue_ab") as (sides, dsns, info):
        for side, (tree, _) in sides.items():
            run_driver(tree, DRIVER, [dsns[side], "0", "setup"])
        for rep in range(a.reps):
            for side in rep_order(rep):
                tree, commit = sides[side]
                args = [dsns[side], str(a.calls), "run", str(a.bulk_calls)]
                r = run_driver(tree, DRIVER, args)
                runs[side].append(r)
                print(f"rep {rep + 1} {side} ({commit}): {r}", flush=True)
    shapes: dict[str, Any] = {}
    for shape in SHAPES:
        before = [r[shape] for r in runs["before"]]
        after = [r[shape] for r in runs["after"]]
        shapes[shape] = {
            "unit": "jobs/s" if shape.startswith("bulk") else "ms (call p50)",
            "before": median(before),
            "after": median(after),
            "paired_ratio": paired_ratio(before, after),
        }
    data = {
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": info,
        "calls_per_shape_and_rep": a.calls,
        "bulk_calls_per_rep": a.bulk_calls,
        "revisions": {side: commit for side, (_, commit) in sides.items()},
        "runs": runs,
        "shapes": shapes,
    }
    out = write_results(data, "enqueue-ab", a.out)
    for shape, s in shapes.items():
        print(
            f"{shape}: before {s['before']}, after {s['after']} {s['unit']}"
            f" (after/before rep by rep: {s['paired_ratio']}x)"
        )
    print(f"raw: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
