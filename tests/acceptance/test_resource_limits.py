"""Resource limits: real worker processes at concurrency 1, 16, 17, 200 and 1000, whose
handlers each hold a ``ctx.transaction()`` open past the lease TTL; and a worker whose
``DEADMAN_HANDLER_POOL_SIZE`` is below its concurrency.

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
from psycopg.conninfo import make_conninfo

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
    all_succeeded,
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


#: how long a "limits.pause" handler's transaction lasts, in the statement the test
#: looks for in pg_stat_activity (a comment says which pool ran it)
PAUSE_S = 1.0
PAUSE_SQL = "SELECT pg_sleep(%(s)s) /* limits.pause {kind} */"


@registry.handler("limits.pause")
async def pause(job: Job, ctx: JobContext) -> None:
    async with ctx.transaction() as conn:
        await conn.execute(PAUSE_SQL.format(kind="async"), {"s": PAUSE_S})
        await conn.execute(
            QUERIES["effect_insert"], {"job_id": job.id, "lease_token": ctx.lease_token}
        )


@registry.handler("limits.pause-sync")
def pause_sync(job: Job, ctx: JobContext) -> None:
    with ctx.transaction() as conn:
        conn.execute(PAUSE_SQL.format(kind="sync"), {"s": PAUSE_S})
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


def _runs(dsn: str, ids: list[int]) -> dict[int, Any]:
    """Each job's (attempts, effects, every attempt succeeded)."""
    rows = sql_all(
        dsn,
        "SELECT j.id, count(DISTINCT a.lease_token) AS attempts,"
        " count(DISTINCT e.lease_token) AS effects,"
        " bool_and(a.outcome = 'succeeded') AS ok"
        " FROM deadman.jobs j"
        " LEFT JOIN deadman.attempts a ON a.job_id = j.id"
        " LEFT JOIN deadman.effects e ON e.job_id = j.id"
        " WHERE j.id = ANY(%s) GROUP BY j.id",
        (ids,),
    )
    return {r["id"]: (r["attempts"], r["effects"], r["ok"]) for r in rows}


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
        return all_succeeded(db_dsn, all_ids)

    # two rounds of HOLD_S at the most per worker, plus start-up on a loaded machine
    wait_for(sample, 2 * HOLD_S + 40, interval=0.05, message="every job to succeed")

    for c, w in workers.items():
        assert w.poll() is None, f"worker c{c} died"
        for event in ("lease_lost", "lease_untrusted", "stale_write_refused", "heartbeat_failed"):
            assert not w.events(event), (c, event, w.events(event)[:3])
    exactly_once = _runs(db_dsn, all_ids)
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


def test_handler_pool_size_caps_each_handler_pool(db_dsn: str, spawn_worker: SpawnWorker) -> None:
    """DEADMAN_HANDLER_POOL_SIZE=2 at concurrency 8: four async and four sync handlers
    each spend PAUSE_S in a ctx.transaction(); at no time do more than two of each
    kind hold a connection (the default, min(8, 16), would let all four), the rest
    wait their turn, and every job is done once with its one effect."""
    app_name = "deadman-handler-pool-test"
    worker = spawn_worker(
        make_conninfo(db_dsn, application_name=app_name),
        concurrency=8,
        queues="handler-pool",
        app="tests.acceptance.test_resource_limits:registry",
        name="handler-pool",
        DEADMAN_HANDLER_POOL_SIZE=2,
    )
    wait_registered(db_dsn, worker.pid)
    with Client(db_dsn) as client:
        ids = client.enqueue_many(
            [client.job("limits.pause", queue="handler-pool") for _ in range(4)]
            + [client.job("limits.pause-sync", queue="handler-pool") for _ in range(4)]
        )
    most = {"async": 0, "sync": 0}

    def sample() -> bool:
        for kind in most:
            n = sql_value(
                db_dsn,
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE application_name = %s AND state = 'active' AND query LIKE %s",
                (app_name, f"%limits.pause {kind}%"),
            )
            most[kind] = max(most[kind], int(n))
        return all_succeeded(db_dsn, ids)

    # two rounds of PAUSE_S per pool, plus start-up on a loaded machine
    wait_for(sample, 2 * PAUSE_S + 40, interval=0.05, message="every job to succeed")
    assert worker.poll() is None
    runs = _runs(db_dsn, ids)
    assert set(runs.values()) == {(1, 1, True)}, runs
    # both pools were seen in use, and never above their size
    assert 1 <= most["async"] <= 2, most
    assert 1 <= most["sync"] <= 2, most
