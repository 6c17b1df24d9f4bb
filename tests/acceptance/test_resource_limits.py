"""Resource limits: real worker processes at concurrency 1, 16, 17, 200 and 1000, whose
handlers each hold a ``ctx.transaction()`` open past the lease TTL.

The worker's own statements (heartbeat, claims, completions) have connections of
their own, so however many handlers sit in transactions, or wait for a handler
connection (above 16 they must: the test cluster has ``max_connections = 200``, and
1000 handlers cannot each have one), the heartbeat keeps every lease alive: no lease
lost or untrusted, every job done exactly once, one effect each.

This module is also the workers' ``--app`` (its ``registry``).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from deadman.client import Client
from deadman.db.queries import QUERIES
from deadman.model import Job
from deadman.registry import Registry
from deadman.worker.context import JobContext
from deadman.worker.process import HANDLER_POOL_MAX
from tests.helpers import wait_for
from tests.helpers.processes import (
    Proc,
    SpawnWorker,
    sql_all,
    sql_value,
    wait_registered,
)

pytestmark = pytest.mark.slow

registry = Registry()

#: Short enough that every handler holds its transaction past it, long enough that a
#: stall of the loaded test machine (1.5 s is seen) plus a late beat stays inside the
#: 3.5 s the worker trusts a lease after a renewal: only starvation can fail the test.
TTL_S = 4.0
HEARTBEAT_S = 0.5
#: each handler holds its transaction this long: past the TTL, so only renewals that
#: go on meanwhile keep the lease
HOLD_S = TTL_S * 1.3


@registry.handler("limits.hold")
async def hold(job: Job, ctx: JobContext) -> None:
    async with ctx.transaction() as conn:
        await asyncio.sleep(HOLD_S)
        await conn.execute(
            QUERIES["effect_insert"], {"job_id": job.id, "lease_token": ctx.lease_token}
        )


@registry.handler("limits.hold-sync")
def hold_sync(job: Job, ctx: JobContext) -> None:
    with ctx.transaction() as conn:
        time.sleep(HOLD_S)  # a sync handler's own work, in its thread
        conn.execute(QUERIES["effect_insert"], {"job_id": job.id, "lease_token": ctx.lease_token})


#: concurrency -> (async jobs, sync jobs): at 17 and above the async jobs outnumber
#: the 16 handler connections, so some handlers wait for one (two rounds); sync
#: handlers only where the connection budget of five workers at once allows.
CASES: dict[int, tuple[int, int]] = {
    1: (1, 1),
    16: (8, 8),
    17: (17, 17),
    200: (24, 0),
    1000: (24, 0),
}
#: per worker: its own statements (COMPLETER_FLUSHES 2 + 4), the listener, and up to
#: HANDLER_POOL_MAX per handler pool in use
BUDGET = sum(6 + 1 + min(c, HANDLER_POOL_MAX) * ((a > 0) + (s > 0)) for c, (a, s) in CASES.items())


def test_handlers_in_long_transactions_never_starve_the_heartbeat(
    db_dsn: str, spawn_worker: SpawnWorker
) -> None:
    workers: dict[int, Proc] = {}
    for c in CASES:
        workers[c] = spawn_worker(
            db_dsn,
            concurrency=c,
            queues=f"c{c}",
            app="tests.acceptance.test_resource_limits:registry",
            name=f"c{c}",
            DEADMAN_LEASE_TTL_S=TTL_S,
            DEADMAN_HEARTBEAT_S=HEARTBEAT_S,
            DEADMAN_POLL_S=0.2,
            DEADMAN_RESCUE_S=0.25,
        )
    ids: dict[int, list[int]] = {}
    worker_ids = {c: wait_registered(db_dsn, w.pid) for c, w in workers.items()}
    with Client(db_dsn) as client:
        for c, (n_async, n_sync) in CASES.items():
            specs = [client.job("limits.hold", queue=f"c{c}") for _ in range(n_async)]
            specs += [client.job("limits.hold-sync", queue=f"c{c}") for _ in range(n_sync)]
            ids[c] = client.enqueue_many(specs)
    all_ids = [i for v in ids.values() for i in v]

    # While they run: how stale each worker's last heartbeat gets, and how many
    # connections the database serves.
    oldest_beat = 0.0
    most_connections = 0

    def sample() -> bool:
        nonlocal oldest_beat, most_connections
        ages = sql_all(
            db_dsn,
            "SELECT extract(epoch FROM clock_timestamp() - last_heartbeat_at) AS age"
            " FROM deadman.workers WHERE id = ANY(%s)",
            (list(worker_ids.values()),),
        )
        oldest_beat = max([oldest_beat, *(float(r["age"]) for r in ages)])
        most_connections = max(
            most_connections,
            int(
                sql_value(
                    db_dsn,
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()",
                )
            ),
        )
        done = sql_value(
            db_dsn,
            "SELECT count(*) FROM deadman.jobs WHERE id = ANY(%s) AND state = 'succeeded'",
            (all_ids,),
        )
        return int(done) == len(all_ids)

    # two rounds of HOLD_S at the most per worker, plus start-up on a loaded machine
    wait_for(sample, 2 * HOLD_S + 40, interval=0.05, message="every job to succeed")

    for c, w in workers.items():
        assert w.poll() is None, f"worker c{c} died"
        for event in ("lease_lost", "lease_untrusted", "stale_write_refused", "heartbeat_failed"):
            assert not w.events(event), (c, event, w.events(event)[:3])
    rows = sql_all(
        db_dsn,
        "SELECT j.id, count(DISTINCT a.lease_token) AS attempts,"
        " count(DISTINCT e.lease_token) AS effects,"
        " bool_and(a.outcome = 'succeeded') AS ok"
        " FROM deadman.jobs j"
        " LEFT JOIN deadman.attempts a ON a.job_id = j.id"
        " LEFT JOIN deadman.effects e ON e.job_id = j.id"
        " WHERE j.id = ANY(%s) GROUP BY j.id",
        (all_ids,),
    )
    exactly_once: dict[int, Any] = {r["id"]: (r["attempts"], r["effects"], r["ok"]) for r in rows}
    assert set(exactly_once.values()) == {(1, 1, True)}, exactly_once
    assert sql_value(db_dsn, "SELECT count(*) FROM deadman.lease_refusals") == 0
    print(
        f"resource limits: {len(all_ids)} jobs holding transactions {HOLD_S:.1f} s past"
        f" a {TTL_S} s TTL; oldest heartbeat seen {oldest_beat:.2f} s;"
        f" at most {most_connections} connections (budget {BUDGET} + the test's)"
    )
    # the heartbeat never fell behind far enough to stop trusting a lease
    assert oldest_beat < TTL_S - HEARTBEAT_S
    # 1000 handlers, 24 of them at once, did not get a connection each
    assert most_connections <= BUDGET + 5
