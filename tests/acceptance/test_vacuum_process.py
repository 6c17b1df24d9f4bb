"""The vacuumer in real worker processes (DECISIONS 72): read from the environment,
run by every worker's maintenance, and it vacuums deadman.jobs once the jobs the
fleet finished leave enough dead versions; every job still ran exactly once.
tests/integration/test_vacuumer.py drives the service itself."""

from __future__ import annotations

import pytest

from deadman.client import Client
from tests.helpers import wait_for
from tests.helpers.processes import SpawnWorker, sql_all, sql_value, states_of, wait_all_state

pytestmark = pytest.mark.slow

VACUUMS = "SELECT vacuum_count FROM pg_stat_user_tables WHERE relid = 'deadman.jobs'::regclass"
THRESHOLD = 300
JOBS = 1500


def test_two_worker_processes_vacuum_the_jobs_table_and_lose_nothing(
    db_dsn: str, spawn_worker: SpawnWorker
) -> None:
    # Autovacuum off for this table, in this test's own database: otherwise it may
    # clean the dead versions first (its threshold here is 50 + 20% of 1,500 rows),
    # and the workers then never see enough of them to vacuum: the one timeout this
    # test had, in a full run on a busy machine.
    sql_all(db_dsn, "ALTER TABLE deadman.jobs SET (autovacuum_enabled = off)")
    before = sql_value(db_dsn, VACUUMS)
    workers = [
        spawn_worker(db_dsn, concurrency=50, DEADMAN_VACUUM_DEAD_TUPLES=THRESHOLD) for _ in range(2)
    ]
    with Client(db_dsn) as client:
        ids = client.enqueue_many(client.job("noop") for _ in range(JOBS))
    wait_all_state(db_dsn, ids, "succeeded", timeout=60)

    # The jobs' dead versions reach the statistics when the workers' backends flush
    # them (within ~10 s of going idle); a worker's next look after that vacuums.
    vacuumed = wait_for(
        lambda: next((e for w in workers for e in w.events("jobs_vacuumed")), None),
        45,
        message="a worker's jobs_vacuumed",
    )
    assert vacuumed["dead_tuples"] >= THRESHOLD
    assert sql_value(db_dsn, VACUUMS) > before
    assert states_of(db_dsn, ids) == {"succeeded": JOBS}
    assert sql_value(db_dsn, "SELECT count(*) FROM deadman.attempts") == JOBS
    for w in workers:
        assert w.poll() is None, w.tail()
        assert not w.events("vacuumer_error"), w.tail()
