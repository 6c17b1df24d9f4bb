"""Pin the plans of the API's read queries on a seeded, analysed table: the listing
walks an index for every filter (migrations/0002_api.sql, 0016, 0020), however rare the
match, a listing by queue or type walks no further than its window, and the
queue-depth check stops at the cap inside the claim index."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from psycopg import sql

from deadman.db.queries import QUERIES
from tests.factories import connect
from tests.helpers.plans import seeded_database

SEED = """
ALTER TABLE deadman.jobs DROP CONSTRAINT jobs_type_valid, DROP CONSTRAINT jobs_queue_valid;
INSERT INTO deadman.jobs (type, queue, state, attempt, started_at, finished_at)
SELECT 'bulk', CASE WHEN i % 2 = 0 THEN 'default' ELSE 'other' END, 'succeeded', 1,
       now(), now()
FROM generate_series(1, 40000) AS i;
INSERT INTO deadman.jobs (type, queue, state, attempt, finished_at)
SELECT 'rare', 'rare-q', 'dead', 1, now() FROM generate_series(1, 20);
INSERT INTO deadman.jobs (type, queue, state)
SELECT 'bulk', 'default', 'queued' FROM generate_series(1, 300);
ALTER TABLE deadman.jobs
    ADD CONSTRAINT jobs_type_valid CHECK (type ~ '^[A-Za-z0-9_.:-]{1,128}$') NOT VALID,
    ADD CONSTRAINT jobs_queue_valid CHECK (queue ~ '^[A-Za-z0-9_.:-]{1,128}$') NOT VALID;
ANALYZE deadman.jobs;
"""


@pytest.fixture(scope="module")
def seeded_dsn(pg_server_dsn: str, template_db: str) -> Iterator[str]:
    with seeded_database(pg_server_dsn, template_db, "api_plans", SEED) as dsn:
        yield dsn


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)


def _plan(dsn: str, name: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    """EXPLAIN as the store runs it: unprepared, so planned for these values."""
    with connect(dsn) as conn:
        row = conn.execute(
            sql.SQL("EXPLAIN (FORMAT JSON) ") + sql.SQL(QUERIES[name]), params, prepare=False
        ).fetchone()
    assert row is not None
    return list(_nodes(next(iter(row.values()))[0]["Plan"]))


def _list(dsn: str, **filters: Any) -> list[dict[str, Any]]:
    params = {"state": None, "type": None, "queue": None, "before": None, "limit": 101}
    params.update(filters)
    params.setdefault("floor", None)
    return _plan(dsn, "job_list", params)


def _index_names(nodes: list[dict[str, Any]]) -> set[str]:
    return {n["Index Name"] for n in nodes if "Index Name" in n}


def _seq_scans(nodes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [n for n in nodes if n["Node Type"] == "Seq Scan"]


@pytest.mark.parametrize(
    ("filters", "index"),
    [
        ({}, "jobs_pkey"),
        ({"before": 20000}, "jobs_pkey"),
        ({"state": "dead"}, "jobs_list_state_idx"),
        ({"state": "dead", "before": 40010}, "jobs_list_state_idx"),
        ({"state": "dead", "queue": "rare-q"}, "jobs_list_state_idx"),
    ],
)
def test_every_listing_walks_an_index(seeded_dsn: str, filters: dict[str, Any], index: str) -> None:
    nodes = _list(seeded_dsn, **filters)
    assert index in _index_names(nodes), nodes
    assert _seq_scans(nodes) == [], nodes
    assert _sorts_beyond_running(nodes) == [], "the index should give the order"


def test_a_windowed_listing_reads_no_further_than_its_window(seeded_dsn: str) -> None:
    """A listing by queue or type (migration 0020) reads the ids between its cursor
    and its floor, along the primary key: the rows it reads are bounded by the
    window, not the table, and no plan scans the table."""
    window = 5_000
    with connect(seeded_dsn) as conn:
        for filters in ({"queue": "rare-q"}, {"type": "rare"}, {"queue": "nowhere"}):
            params: dict[str, Any] = {"state": None, "type": None, "queue": None, "limit": 51}
            params.update(filters, before=30_000, floor=30_000 - window)
            row = conn.execute(
                sql.SQL("EXPLAIN (ANALYZE, FORMAT JSON) ") + sql.SQL(QUERIES["job_list"]),
                params,
                prepare=False,
            ).fetchone()
            assert row is not None
            nodes = list(_nodes(next(iter(row.values()))[0]["Plan"]))
            assert _seq_scans(nodes) == [], (filters, nodes)
            assert "jobs_pkey" in _index_names(nodes), (filters, nodes)
            read = sum(
                n["Actual Rows"] + n.get("Rows Removed by Filter", 0)
                for n in nodes
                if n["Node Type"] in ("Index Scan", "Bitmap Heap Scan")
            )
            assert 0 < read <= window, (filters, read, nodes)


def _sorts_beyond_running(nodes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Sorts of anything but the running jobs: those are as few as the fleet's slots
    and come from jobs_running_idx, in job_list's branch of their own (0016)."""
    return [
        n
        for n in nodes
        if n["Node Type"] == "Sort" and "jobs_running_idx" not in _index_names(list(_nodes(n)))
    ]


def test_running_jobs_are_listed_from_their_own_index(seeded_dsn: str) -> None:
    """The listing indexes hold no running job (migration 0016): with or without a
    filter, the running ones come from jobs_running_idx, merged in id order."""
    for filters in (
        {},
        {"state": "running"},
        {"queue": "rare-q", "floor": 30_000},
        {"type": "rare", "floor": 30_000},
    ):
        nodes = _list(seeded_dsn, **filters)
        assert "jobs_running_idx" in _index_names(nodes), (filters, nodes)
        assert _seq_scans(nodes) == [], (filters, nodes)


def test_common_and_combined_filters_never_scan_the_table(seeded_dsn: str) -> None:
    """A filter that half the rows match is served by walking the primary key
    backwards until the page is full (a few hundred rows): also fine. What must never
    happen is a scan of the table, or a sort of many matching rows (a rare combination
    may be found through two indexes and its few rows sorted)."""
    for filters in (
        {"queue": "other", "floor": 20_000},
        {"state": "succeeded"},
        {"state": "dead", "queue": "rare-q"},
        {"state": "dead", "type": "rare", "queue": "rare-q"},
        {"state": "queued", "queue": "default"},
    ):
        nodes = _list(seeded_dsn, **filters)
        assert _index_names(nodes), (filters, nodes)
        assert _seq_scans(nodes) == [], (filters, nodes)
        big_sorts = [n for n in nodes if n["Node Type"] == "Sort" and n["Plan Rows"] > 1000]
        assert big_sorts == [], (filters, nodes)


def test_queue_depth_stops_at_the_cap_in_the_claim_index(seeded_dsn: str) -> None:
    nodes = _plan(seeded_dsn, "queue_depth_get", {"queue": "default", "cap": 100})
    assert "jobs_claim_idx" in _index_names(nodes), nodes
    assert any(n["Node Type"] == "Limit" for n in nodes)
    assert _seq_scans(nodes) == []
