"""Query plans as the plan tests read them: a seeded copy of the migrated template
(``SEED``: a busy queue), EXPLAIN of a named query, and what a plan uses."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from deadman.db.queries import QUERIES
from tests.factories import connect

SEED = """
-- The two name CHECKs use a bounded repetition ({1,128}) that costs ~20 us a row in
-- Postgres' regex engine: most of the seeding time. Plans do not depend on CHECK
-- constraints, so they are lifted for the seed and put back NOT VALID after it.
ALTER TABLE deadman.jobs DROP CONSTRAINT jobs_type_valid, DROP CONSTRAINT jobs_queue_valid;
-- The bulk: finished jobs of the last 20 hours, half of them in another queue.
INSERT INTO deadman.jobs (type, queue, priority, state, attempt, run_at, created_at,
                          started_at, finished_at)
SELECT 'seed', CASE WHEN i % 2 = 0 THEN 'default' ELSE 'other' END, (i % 7) - 3,
       'succeeded', 1, now() - interval '1 day', now() - interval '1 day',
       now() - interval '21 hours', now() - (i % 72000) * interval '1 second'
FROM generate_series(1, 100000) AS i;
-- Some past retention, some dead or cancelled.
INSERT INTO deadman.jobs (type, state, attempt, created_at, started_at, finished_at)
SELECT 'seed', 'succeeded', 1, now() - interval '3 days', now() - interval '3 days',
       now() - interval '30 hours'
FROM generate_series(1, 1000);
INSERT INTO deadman.jobs (type, queue, state, attempt, finished_at)
SELECT 'seed', 'other', CASE WHEN i % 2 = 0 THEN 'dead' ELSE 'cancelled' END, 1,
       now() - (i % 100) * interval '1 hour'
FROM generate_series(1, 2000) AS i;
-- The live part: queued and scheduled work in both queues, and running jobs.
INSERT INTO deadman.jobs (type, queue, priority, state, run_at)
SELECT 'seed', CASE WHEN i % 2 = 0 THEN 'default' ELSE 'other' END, (i % 5) - 2,
       CASE WHEN i % 10 = 0 THEN 'scheduled' ELSE 'queued' END,
       CASE WHEN i % 10 = 0 THEN now() + interval '1 hour' ELSE now() - i * interval '1 ms' END
FROM generate_series(1, 4000) AS i;
INSERT INTO deadman.jobs (type, state, attempt, started_at, lease_token, lease_worker,
                          lease_expires_at)
SELECT 'seed', 'running', 1, now(), nextval('deadman.lease_token_seq'), 'w-' || (i % 20),
       now() + CASE WHEN i % 10 = 0 THEN interval '-5 seconds' ELSE interval '30 seconds' END
FROM generate_series(1, 500) AS i;
ALTER TABLE deadman.jobs
    ADD CONSTRAINT jobs_type_valid CHECK (type ~ '^[A-Za-z0-9_.:-]{1,128}$') NOT VALID,
    ADD CONSTRAINT jobs_queue_valid CHECK (queue ~ '^[A-Za-z0-9_.:-]{1,128}$') NOT VALID;
ANALYZE deadman.jobs;
"""


@contextmanager
def seeded_database(server_dsn: str, template: str, prefix: str, *statements: str) -> Iterator[str]:
    """A copy of the migrated template, seeded by ``statements`` (each run in
    autocommit), dropped afterwards. For the plan tests: one per module, because
    EXPLAIN without ANALYZE executes nothing and the tests cannot disturb each other."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server_dsn, autocommit=True) as admin:
        admin.execute(
            sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                sql.Identifier(name), sql.Identifier(template)
            )
        )
    dsn = make_conninfo(server_dsn, dbname=name)
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            for statement in statements:
                conn.execute(statement.encode())
        yield dsn
    finally:
        with psycopg.connect(server_dsn, autocommit=True) as admin:
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


def plan_nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from plan_nodes(child)


def explain(dsn: str, name: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    with connect(dsn) as conn:
        row = conn.execute(
            sql.SQL("EXPLAIN (FORMAT JSON) ") + sql.SQL(QUERIES[name]), params
        ).fetchone()
    assert row is not None
    doc = next(iter(row.values()))
    return list(plan_nodes(doc[0]["Plan"]))


def indexes_used(nodes: list[dict[str, Any]]) -> set[str]:
    return {n["Index Name"] for n in nodes if "Index Name" in n}


def seq_scans_on_jobs(nodes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [n for n in nodes if n["Node Type"] == "Seq Scan" and n.get("Relation Name") == "jobs"]
