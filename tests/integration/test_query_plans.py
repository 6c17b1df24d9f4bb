"""Pin the plans of the hot queries on a seeded, analysed table.

The partial indexes are shaped after the claim, rescue and prune queries; a query
edit that silently stops using them turns a 1 ms claim into a scan of every finished
job. The real SQL from QUERIES is EXPLAINed with the parameters the store sends.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.rows import DictRow

from deadman.db.plans import generic_plans
from deadman.db.queries import QUERIES, numbered
from deadman.model import AttemptOutcome, JobState
from deadman.store import Finish, HeartbeatParams, finish_params, heartbeat_params
from tests.factories import connect, insert_job
from tests.helpers import wait_for
from tests.helpers.plans import (
    SEED,
    explain,
    indexes_used,
    plan_nodes,
    seeded_database,
    seq_scans_on_jobs,
)


@pytest.fixture(scope="module")
def seeded_dsn(pg_server_dsn: str, template_db: str) -> Iterator[str]:
    with seeded_database(pg_server_dsn, template_db, "plans", SEED) as dsn:
        yield dsn


def test_the_seed_looks_like_a_busy_queue(seeded_dsn: str) -> None:
    with connect(seeded_dsn) as conn:
        counts = {
            r["state"]: r["n"]
            for r in conn.execute(
                "SELECT state, count(*) AS n FROM deadman.jobs GROUP BY state"
            ).fetchall()
        }
    assert sum(counts.values()) > 100_000
    assert counts["running"] == 500 and counts["queued"] == 3600


@pytest.mark.parametrize("limit", [1, 10, 100])
def test_claim_uses_the_claim_index(seeded_dsn: str, limit: int) -> None:
    nodes = explain(
        seeded_dsn,
        "job_claim",
        {
            "queue": "default",
            "worker": "w",
            "limit": limit,
            "ttl_ms": 30_000,
            "quarantine_at": 5,
            "keyed": True,
        },
    )
    assert "jobs_claim_idx" in indexes_used(nodes), nodes
    assert seq_scans_on_jobs(nodes) == []


def test_finish_and_heartbeat_find_rows_through_the_primary_key(db_dsn: str) -> None:
    # The lock step of both batched writes must cost in proportion to the batch, not
    # to the number of running jobs (a scan of all running rows per flush made
    # heartbeats wait seconds on the completer's locks under load). Many running
    # rows, as under a big fleet: without `id = ANY(...)` the finish plan scans them
    # all through jobs_running_idx.
    with connect(db_dsn) as conn:
        conn.execute(
            "INSERT INTO deadman.jobs (type, state, attempt, lease_token, lease_worker,"
            " lease_expires_at, started_at)"
            " SELECT 'noop', 'running', 1, nextval('deadman.lease_token_seq'), 'w',"
            " now() + interval '1 minute', now() FROM generate_series(1, 20000)"
        )
        conn.execute("INSERT INTO deadman.jobs (type) SELECT 'noop' FROM generate_series(1, 20000)")
        conn.execute("ANALYZE deadman.jobs")
        leases = [
            (int(r["id"]), int(r["lease_token"]))
            for r in conn.execute(
                "SELECT id, lease_token FROM deadman.jobs WHERE state = 'running' LIMIT 300"
            )
        ]
    finishes = [Finish(i, t, JobState.SUCCEEDED, AttemptOutcome.SUCCEEDED) for i, t in leases]
    for name, params in (
        ("job_finish_many", finish_params(finishes)),
        (
            "job_heartbeat_many",
            heartbeat_params(HeartbeatParams("w", "h", 1, ["default"], 10, 1000, leases)),
        ),
    ):
        nodes = explain(db_dsn, name, params)
        assert "jobs_pkey" in indexes_used(nodes), (name, nodes)
        assert "jobs_running_idx" not in indexes_used(nodes), (name, nodes)
        assert seq_scans_on_jobs(nodes) == [], name


def _numbered(name: str) -> tuple[str, list[str]]:
    """QUERIES[name] with $n parameters, and the parameter names in $n order."""
    return numbered(QUERIES[name])


def _prepare(conn: psycopg.Connection[DictRow], probe: str, name: str) -> None:
    text = sql.SQL(_numbered(name)[0])
    conn.execute(sql.SQL("PREPARE {} AS ").format(sql.Identifier(probe)) + text)


def _explain_prepared(
    conn: psycopg.Connection[DictRow], probe: str, name: str, params: dict[str, Any]
) -> list[dict[str, Any]]:
    args = sql.SQL(", ").join(sql.Literal(params[k]) for k in _numbered(name)[1])
    row = conn.execute(
        sql.SQL("EXPLAIN (FORMAT JSON) EXECUTE {} ({})").format(sql.Identifier(probe), args)
    ).fetchone()
    assert row is not None
    return list(plan_nodes(next(iter(row.values()))[0]["Plan"]))


def _generic_plan(dsn: str, name: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    """The plan a prepared statement runs once Postgres switches to its generic plan
    (the worker prepares both batched writes): PREPARE the query with $n parameters,
    force the generic plan, EXPLAIN EXECUTE it."""
    with connect(dsn) as conn:
        conn.execute("SET plan_cache_mode = force_generic_plan")
        _prepare(conn, "plan_probe", name)
        return _explain_prepared(conn, "plan_probe", name, params)


def _worker_params(leases: list[tuple[int, int]]) -> dict[str, dict[str, Any]]:
    return {
        "job_claim": {
            "queue": "default",
            "worker": "w",
            "limit": 50,
            "ttl_ms": 30_000,
            "quarantine_at": 5,
            "keyed": True,
        },
        "job_finish_many": finish_params(
            [Finish(i, t, JobState.SUCCEEDED, AttemptOutcome.SUCCEEDED) for i, t in leases]
        ),
        "job_heartbeat_many": heartbeat_params(
            HeartbeatParams("w", "h", 1, ["default"], 10, 1000, leases)
        ),
    }


def test_a_worker_session_keeps_index_plans_made_while_the_table_was_empty(
    db_dsn: str,
) -> None:
    """A worker's session keeps one generic plan per statement (db/plans.py), made at
    its first execution. Made when the jobs table had been analyzed empty (a new
    deployment, every job pruned), the plans of the claim, the finish and the
    heartbeat scanned the whole table (and the claim sorted it) for as long as the
    session lived or until the next ANALYZE: here after 20,000 jobs arrived. The
    worker's sessions turn sequential scans off (DECISIONS 60), so those plans use the
    indexes."""
    statements = ("job_claim", "job_finish_many", "job_heartbeat_many")
    with connect(db_dsn) as admin, connect(generic_plans(db_dsn)) as worker:
        admin.execute("ALTER TABLE deadman.jobs SET (autovacuum_enabled = false)")
        admin.execute("ANALYZE deadman.jobs")
        empty = _worker_params([(i, 1) for i in range(1, 51)])
        for name in statements:
            _prepare(worker, f"probe_{name}", name)
            args = sql.SQL(", ").join(sql.Literal(empty[name][k]) for k in _numbered(name)[1])
            worker.execute(sql.SQL("EXECUTE {} ({})").format(sql.Identifier(f"probe_{name}"), args))
        admin.execute("INSERT INTO deadman.jobs (type) SELECT 'noop' FROM generate_series(1, 2e4)")
        ids = admin.execute("SELECT id FROM deadman.jobs ORDER BY id LIMIT 50").fetchall()
        params = _worker_params([(int(r["id"]), 1) for r in ids])
        for name in statements:
            plan = _explain_prepared(worker, f"probe_{name}", name, params[name])
            assert seq_scans_on_jobs(plan) == [], (name, plan)


#: The indexes that hold only jobs a claim could take: a look through any other (the
#: listing indexes hold every finished job) grows with the history.
CLAIM_INDEXES = {"jobs_claim_idx", "jobs_claim_keyed_idx"}


def _jobs_indexes(nodes: list[dict[str, Any]]) -> set[str]:
    return {
        n["Index Name"] for n in nodes if n.get("Relation Name") == "jobs" and "Index Name" in n
    }


LEFT = {"queue": "default", "quarantine_at": 5}


@pytest.mark.parametrize("statistics", ["never analyzed", "analyzed empty"])
def test_what_a_claim_left_is_read_through_the_claim_indexes(db_dsn: str, statistics: str) -> None:
    """After every claim that is not full (at low load, every claim: DECISIONS 66) the
    producer asks what it left. Unordered, those looks' generic plan on a new table
    read jobs_list_queue_idx and walked every finished job of the queue at each idle
    cycle (982 tuples per job, bench.low_load)."""
    with connect(db_dsn) as admin, connect(generic_plans(db_dsn)) as worker:
        admin.execute("ALTER TABLE deadman.jobs SET (autovacuum_enabled = false)")
        if statistics == "analyzed empty":
            admin.execute("ANALYZE deadman.jobs")
        else:
            row = admin.execute(
                "SELECT reltuples FROM pg_class WHERE oid = 'deadman.jobs'::regclass"
            ).fetchone()
            assert row is not None and row["reltuples"] < 0  # never analyzed indeed
        _prepare(worker, "probe_left", "job_claim_left")
        plan = _explain_prepared(worker, "probe_left", "job_claim_left", LEFT)
    assert _jobs_indexes(plan) == CLAIM_INDEXES, plan
    assert seq_scans_on_jobs(plan) == [], plan


def test_what_a_busy_queues_claim_left_is_read_through_the_claim_indexes(
    seeded_dsn: str,
) -> None:
    plan = _generic_plan(seeded_dsn, "job_claim_left", LEFT)
    assert _jobs_indexes(plan) == CLAIM_INDEXES, plan
    assert seq_scans_on_jobs(plan) == [], plan


def test_batched_writes_use_the_primary_key_when_statistics_say_nothing_runs(
    db_dsn: str,
) -> None:
    # Statistics gathered while every job was queued (a bulk enqueue before the
    # workers start) say no row is running. A `state = 'running'` test in the
    # batched writes then made the planner walk jobs_running_idx, every running
    # row once per row of the batch: 2.5 ms per 10-row flush with 2,000 running
    # jobs. Both the custom and the generic (prepared) plan must go by the key.
    with connect(db_dsn) as conn:
        conn.execute("ALTER TABLE deadman.jobs SET (autovacuum_enabled = false)")
        conn.execute("INSERT INTO deadman.jobs (type) SELECT 'noop' FROM generate_series(1, 20000)")
        conn.execute("ANALYZE deadman.jobs")
        conn.execute(
            "UPDATE deadman.jobs SET state = 'running', attempt = 1, started_at = now(),"
            " lease_token = nextval('deadman.lease_token_seq'), lease_worker = 'w',"
            " lease_expires_at = now() + interval '1 minute' WHERE id % 4 = 0"
        )
        leases = [
            (int(r["id"]), int(r["lease_token"]))
            for r in conn.execute(
                "SELECT id, lease_token FROM deadman.jobs WHERE state = 'running' LIMIT 50"
            )
        ]
    finishes = [Finish(i, t, JobState.SUCCEEDED, AttemptOutcome.SUCCEEDED) for i, t in leases]
    beat = heartbeat_params(HeartbeatParams("w", "h", 1, ["default"], 10, 1000, leases))
    for name, params in (
        ("job_finish_many", finish_params(finishes)),
        ("job_heartbeat_many", beat),
    ):
        for plan in (explain(db_dsn, name, params), _generic_plan(db_dsn, name, params)):
            assert "jobs_pkey" in indexes_used(plan), (name, plan)
            assert "jobs_running_idx" not in indexes_used(plan), (name, plan)
            assert seq_scans_on_jobs(plan) == [], (name, plan)


def test_rescue_uses_the_running_index(seeded_dsn: str) -> None:
    nodes = explain(
        seeded_dsn, "job_rescue_expired", {"max_rescues": 5, "quarantine_at": 5, "limit": 1000}
    )
    assert "jobs_running_idx" in indexes_used(nodes), nodes
    assert seq_scans_on_jobs(nodes) == []


def test_prune_finds_its_rows_through_the_finished_index(seeded_dsn: str) -> None:
    nodes = explain(
        seeded_dsn,
        "job_prune_finished",
        {"succeeded_ms": 24 * 3600 * 1000, "failed_ms": 7 * 24 * 3600 * 1000, "limit": 1000},
    )
    assert "jobs_finished_idx" in indexes_used(nodes), nodes
    # Both branches of the doomed CTE go through the index. The DELETE's join back to
    # jobs may hash a filterless Seq Scan at this table size (the planner switches to
    # pkey lookups on bigger tables); what must never happen is a scan that *searches*
    # for prunable rows.
    searching = [n for n in seq_scans_on_jobs(nodes) if "Filter" in n]
    assert searching == [], searching
    finished_at_scans = [n for n in nodes if "finished_at" in str(n.get("Index Cond", ""))]
    assert len(finished_at_scans) == 2
    assert {n["Index Name"] for n in finished_at_scans} == {"jobs_finished_idx"}


def test_workflow_prune_checks_for_nodes_through_the_workflow_index(seeded_dsn: str) -> None:
    """'No node left' must be an index probe per workflow, not a scan of 100k jobs."""
    nodes = explain(seeded_dsn, "workflow_prune_finished", {"keep_ms": 60_000, "limit": 1000})
    assert seq_scans_on_jobs(nodes) == [], nodes
    assert "jobs_workflow_node_uq" in indexes_used(nodes), nodes


# ------------------------------------------------------------------ HOT renewals


def _xact_updates(conn: psycopg.Connection[DictRow]) -> tuple[int, int]:
    row = conn.execute(
        "SELECT pg_stat_get_xact_tuples_updated('deadman.jobs'::regclass) AS updated,"
        " pg_stat_get_xact_tuples_hot_updated('deadman.jobs'::regclass) AS hot"
    ).fetchone()
    assert row is not None
    return int(row["updated"]), int(row["hot"])


def _renew(conn: psycopg.Connection[DictRow], leases: list[tuple[int, int]]) -> int:
    params = heartbeat_params(
        HeartbeatParams(
            worker="w-hot",
            hostname="h",
            pid=1,
            queues=["default"],
            concurrency=len(leases),
            ttl_ms=60_000,
            leases=leases,
        )
    )
    return len(conn.execute(QUERIES["job_heartbeat_many"], params).fetchall())


def _running_leases(conn: psycopg.Connection[DictRow], n: int) -> list[tuple[int, int]]:
    return [
        (int(r["id"]), int(r["lease_token"]))
        for r in conn.execute(
            "SELECT id, lease_token FROM deadman.jobs WHERE state = 'running' ORDER BY id LIMIT %s",
            (n,),
        )
    ]


def test_lease_renewal_is_a_hot_update(seeded_dsn: str) -> None:
    with connect(seeded_dsn, autocommit=False) as conn:
        (lease,) = _running_leases(conn, 1)
        updated0, hot0 = _xact_updates(conn)
        assert _renew(conn, [lease]) == 1
        updated1, hot1 = _xact_updates(conn)
        conn.rollback()  # leave the shared seed as it was
    assert (updated1 - updated0, hot1 - hot0) == (1, 1)


def test_batched_renewals_settle_into_hot_updates(db_dsn: str) -> None:
    # Fifty running jobs packed into the same pages: the first batched renewal can only
    # put as many new versions on a page as fillfactor 80 left room for; once the old
    # versions are dead, page pruning makes room and every later round is all HOT.
    # Pruning waits for every snapshot of this database that could still see the old
    # versions: an autoanalyze of the freshly filled table holds one for a moment (one
    # flake on a shared cluster), so autovacuum is off for this test's own database's
    # table. Another backend of this database can still hold a snapshot for a moment
    # (an autovacuum worker's first visit to a new database: one failure in a
    # fresh-clone suite, ten rounds in a row at 9 HOT of 50), so the rounds go on until
    # they are all HOT or 10 s have passed, with a pause between the later ones. A
    # horizon held for good still fails it, and the failure names who held it.
    with connect(db_dsn) as setup:
        setup.execute("ALTER TABLE deadman.jobs SET (autovacuum_enabled = off)")
        for _ in range(50):
            insert_job(setup, state="running")
    rounds: list[tuple[int, int]] = []
    with connect(db_dsn, autocommit=False) as conn:
        leases = _running_leases(conn, 50)
        conn.commit()

        renewed: list[int] = []

        def all_hot() -> bool:
            updated0, hot0 = _xact_updates(conn)
            renewed.append(_renew(conn, leases))
            updated1, hot1 = _xact_updates(conn)
            conn.commit()
            rounds.append((updated1 - updated0, hot1 - hot0))
            return rounds[-1] == (50, 50)

        # wait_for's own timeout is not the verdict: the assertions below are, with
        # the rounds and the snapshot holders in their message
        with contextlib.suppress(AssertionError):
            wait_for(all_hot, 10, interval=0.05, message="a round of renewals all HOT")
        holders = conn.execute(
            "SELECT pid, backend_type, state, backend_xmin::text, left(query, 60) AS query"
            " FROM pg_stat_activity WHERE datname = current_database()"
            " AND backend_xmin IS NOT NULL AND pid <> pg_backend_pid()"
        ).fetchall()
        conn.commit()
    assert set(renewed) == {50}, renewed  # every round renewed every lease
    assert rounds[0][1] > 0, rounds
    assert rounds[-1] == (50, 50), (rounds, holders)


def test_a_claim_is_not_hot_so_the_measurement_can_fail(db_dsn: str) -> None:
    # The control: a claim changes indexed columns (state, lease_worker), so it cannot
    # be HOT. If this ever reads as HOT, the check above proves nothing.
    with connect(db_dsn) as setup:
        running = insert_job(setup, state="running")
        insert_job(setup)
    assert running.lease_token is not None
    with connect(db_dsn, autocommit=False) as conn:
        updated0, hot0 = _xact_updates(conn)
        assert _renew(conn, [(running.id, running.lease_token)]) == 1
        claimed = conn.execute(
            QUERIES["job_claim"],
            {
                "queue": "default",
                "worker": "w",
                "limit": 1,
                "ttl_ms": 1000,
                "quarantine_at": 5,
                "keyed": True,
            },
        ).fetchall()
        assert len(claimed) == 1
        updated1, hot1 = _xact_updates(conn)
        conn.commit()
    assert (updated1 - updated0, hot1 - hot0) == (2, 1)
