"""The operator queries (metrics, /queues, /stats, CLI, dashboard) stay cheap on a big
table: EXPLAINed on the seeded, analysed table of test_query_plans (100k+ finished
jobs), none of them scans the jobs table, and the finished-job counts stop at their
cap and fall back to an estimate that is close to the truth."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from deadman.db.queries import QUERIES
from deadman.store import FINISHED_COUNT_CAP
from tests.factories import connect
from tests.helpers.plans import (
    SEED,
    explain,
    indexes_used,
    seeded_database,
    seq_scans_on_jobs,
)


@pytest.fixture(scope="module")
def big_dsn(pg_server_dsn: str, template_db: str) -> Iterator[str]:
    # VACUUM sets the visibility map: index-only scans
    with seeded_database(
        pg_server_dsn, template_db, "ops_plans", SEED, "VACUUM deadman.jobs"
    ) as dsn:
        yield dsn


PENDING_INDEXES = {"jobs_list_state_idx", "jobs_claim_idx", "jobs_running_idx"}


def test_queue_list_reads_only_unfinished_rows(big_dsn: str) -> None:
    nodes = explain(big_dsn, "queue_list", {})
    assert not seq_scans_on_jobs(nodes)
    assert indexes_used(nodes) & PENDING_INDEXES


def test_queue_set_paused_reads_only_that_queues_unfinished_rows(big_dsn: str) -> None:
    nodes = explain(big_dsn, "queue_set_paused", {"name": "default", "paused": True})
    assert not seq_scans_on_jobs(nodes)


def test_finished_counts_stop_at_the_cap_in_the_state_index(big_dsn: str) -> None:
    nodes = explain(big_dsn, "job_counts_finished", {"cap": FINISHED_COUNT_CAP})
    assert not seq_scans_on_jobs(nodes)
    scans = [n for n in nodes if n.get("Relation Name") == "jobs"]
    assert scans and all(n["Node Type"] == "Index Only Scan" for n in scans), scans
    # succeeded along jobs_finished_idx, dead and cancelled along jobs_list_state_idx
    # (succeeded jobs are in no listing index since migration 0016)
    assert {n["Index Name"] for n in scans} == {"jobs_list_state_idx", "jobs_finished_idx"}
    assert any(n["Node Type"] == "Limit" for n in nodes)


def test_finished_counts_are_exact_below_the_cap_and_estimated_above(big_dsn: str) -> None:
    with connect(big_dsn) as conn:
        got = {
            r["state"]: (r["n"], r["estimated"])
            for r in conn.execute(QUERIES["job_counts_finished"], {"cap": FINISHED_COUNT_CAP})
        }
        true = {
            r["state"]: r["n"]
            for r in conn.execute(
                "SELECT state, count(*) AS n FROM deadman.jobs"
                " WHERE state IN ('succeeded', 'dead', 'cancelled') GROUP BY state"
            )
        }
    assert got["dead"] == (true["dead"], False)
    assert got["cancelled"] == (true["cancelled"], False)
    n, estimated = got["succeeded"]
    assert estimated and true["succeeded"] > FINISHED_COUNT_CAP
    assert abs(n - true["succeeded"]) <= 0.1 * true["succeeded"], (n, true["succeeded"])


@pytest.mark.parametrize(
    ("name", "params", "index"),
    [
        ("worker_list", {"ttl_ms": 10_000}, "jobs_running_idx"),
        ("throughput_recent", {"minutes": 30}, "jobs_finished_idx"),
        (
            "job_retry_dead_many",
            {"type": None, "queue": None, "after": None, "limit": 1000},
            "jobs_list_state_idx",
        ),
    ],
)
def test_dashboard_and_cli_queries_use_their_index(
    big_dsn: str, name: str, params: dict[str, object], index: str
) -> None:
    nodes = explain(big_dsn, name, params)
    assert not seq_scans_on_jobs(nodes)
    assert index in indexes_used(nodes)
