"""The vacuumer (DECISIONS 72) on a real Postgres: it vacuums deadman.jobs once dead
versions pass its threshold and the claim index's dead entries go with them; it skips
a table another vacuum holds instead of waiting; a role that may not vacuum the table
is told once and never retried; stopping the service cancels a VACUUM under way, on
the server too."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from deadman import Client
from deadman.config import Settings
from deadman.devdb import Cluster
from deadman.maintenance import Vacuumer, VacuumReport
from deadman.model import AttemptOutcome, JobState
from deadman.store import AsyncStore, ClaimParams, Finish
from tests.factories import async_store, connect, run_async
from tests.helpers import wait_for, wait_for_async

#: the test's threshold: far below the default, so a few hundred jobs pass it
THRESHOLD = 200
SETTINGS = replace(Settings(), vacuum_dead_tuples=THRESHOLD)
JOBS = 2000

#: what the claim's index scan reads when nothing is due: the dead entries' pages
CLAIM_SCAN = """
EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON)
SELECT id FROM deadman.jobs
WHERE queue = 'default' AND state IN ('queued', 'scheduled', 'retrying')
ORDER BY queue, (limit_key IS NULL), priority DESC, run_at, id
LIMIT 1
"""

TABLE_STATS = """
SELECT n_dead_tup, vacuum_count FROM pg_stat_user_tables
WHERE relid = 'deadman.jobs'::regclass
"""


async def claim_and_finish(store: AsyncStore, n: int, batch: int = 500) -> None:
    """Claim and finish ``n`` queued jobs, ``batch`` at a time, as a worker would; each
    claim must find jobs and each finish must be accepted whole."""
    params = ClaimParams("default", "vacuum-test", batch, 30_000)
    done = 0
    while done < n:
        jobs = await store.job_claim(params)
        assert jobs, f"nothing to claim after {done} of {n}"
        finishes = []
        for j in jobs:
            assert j.lease is not None
            finishes.append(
                Finish(j.id, j.lease.token, JobState.SUCCEEDED, AttemptOutcome.SUCCEEDED)
            )
        assert await store.job_finish_many(finishes) == {j.id for j in jobs}
        done += len(jobs)


def enqueue(dsn: str, n: int) -> None:
    with Client(dsn) as client:
        client.enqueue_many([client.job("noop") for _ in range(n)])


def run_jobs_through(dsn: str, n: int) -> None:
    """``n`` jobs enqueued, claimed and finished; then their statistics flushed (the
    store's connections are closed)."""
    enqueue(dsn, n)

    async def main() -> None:
        async with async_store(dsn) as store:
            await claim_and_finish(store, n)

    run_async(main)


def claim_scan_pages(dsn: str) -> int:
    with connect(dsn) as conn:
        row = conn.execute(CLAIM_SCAN).fetchone()
        assert row is not None
        plan = row["QUERY PLAN"][0]["Plan"]
        return int(plan["Shared Hit Blocks"]) + int(plan["Shared Read Blocks"])


def table_stats(dsn: str) -> tuple[int, int]:
    with connect(dsn) as conn:
        row = conn.execute(TABLE_STATS).fetchone()
        assert row is not None
        return int(row["n_dead_tup"]), int(row["vacuum_count"])


def tick(dsn: str, vacuumer_settings: Settings = SETTINGS) -> VacuumReport:
    async def main() -> VacuumReport:
        async with async_store(dsn) as store:
            return await Vacuumer(store, vacuumer_settings).tick()

    return run_async(main)


@pytest.fixture
def no_autovacuum(db_dsn: str) -> Iterator[str]:
    """deadman.jobs with autovacuum off, so only the vacuumer can clean it here."""
    with connect(db_dsn) as conn:
        conn.execute("ALTER TABLE deadman.jobs SET (autovacuum_enabled = false)")
    yield db_dsn


def test_a_tick_vacuums_past_the_threshold_and_the_claim_stops_walking_dead_entries(
    no_autovacuum: str,
) -> None:
    dsn = no_autovacuum
    run_jobs_through(dsn, JOBS)
    wait_for(lambda: table_stats(dsn)[0] >= THRESHOLD, 15, message="dead tuples reported")
    dead_before, vacuums_before = table_stats(dsn)
    pages_before = claim_scan_pages(dsn)
    # each job left its 'queued' entry: the scan reads their pages to find nothing
    assert pages_before > 5, pages_before

    report = tick(dsn)

    assert report.look is not None and report.look.dead_tuples == dead_before
    assert report.outcome == "vacuumed"
    dead_after, vacuums_after = table_stats(dsn)
    assert vacuums_after == vacuums_before + 1
    assert dead_after < THRESHOLD
    assert claim_scan_pages(dsn) <= 2, "the claim index still holds dead pages"
    # a second tick at once finds nothing to do: below the threshold, just vacuumed
    again = tick(dsn)
    assert again.outcome is None and again.look is not None
    assert table_stats(dsn)[1] == vacuums_after


def test_below_the_threshold_a_tick_only_looks(no_autovacuum: str) -> None:
    dsn = no_autovacuum
    run_jobs_through(dsn, 50)
    wait_for(lambda: table_stats(dsn)[0] > 0, 15, message="dead tuples reported")
    vacuums = table_stats(dsn)[1]
    report = tick(dsn, replace(SETTINGS, vacuum_dead_tuples=1_000_000))
    assert report.look is not None and 0 < report.look.dead_tuples < 1_000_000
    assert report.outcome is None
    assert table_stats(dsn)[1] == vacuums


def test_a_table_another_vacuum_holds_is_skipped_not_waited_for(db_dsn: str) -> None:
    """The lock a VACUUM takes, held by another session: SKIP_LOCKED returns at once."""

    async def vacuum_once() -> str:
        async with async_store(db_dsn) as store:
            return await store.jobs_vacuum()

    with connect(db_dsn, autocommit=False) as holder:
        holder.execute("LOCK TABLE deadman.jobs IN SHARE UPDATE EXCLUSIVE MODE")
        holder.execute("SET LOCAL statement_timeout = '1min'")
        started = time.monotonic()
        assert run_async(vacuum_once) == "locked"
        # it came back while the lock was still held: it did not queue behind it
        assert holder.execute("SELECT 1 AS one").fetchone() == {"one": 1}
        assert time.monotonic() - started < 30
        holder.rollback()
    assert run_async(vacuum_once) == "vacuumed"


@pytest.fixture
def stranger_dsn(db_dsn: str, pg_cluster: Cluster | None) -> Iterator[str]:
    """A login role that owns neither deadman.jobs nor the database (may read it).
    Skipped only on a server given by DEADMAN_TEST_DATABASE_URL whose role may not
    create roles; on the suite's own cluster (a superuser) that is a failure."""
    role = f"vacuum_stranger_{uuid.uuid4().hex[:8]}"
    with connect(db_dsn) as conn:
        try:
            conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
        except psycopg.errors.InsufficientPrivilege:
            if pg_cluster is not None:
                raise
            pytest.skip("the given test server's role cannot create roles")
        conn.execute(sql.SQL("GRANT deadman_reader TO {}").format(sql.Identifier(role)))
    try:
        yield make_conninfo(db_dsn, user=role)
    finally:
        with connect(db_dsn) as conn:
            conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def test_a_role_that_may_not_vacuum_is_told_once_and_never_tries(
    no_autovacuum: str, stranger_dsn: str
) -> None:
    run_jobs_through(no_autovacuum, 300)
    wait_for(lambda: table_stats(no_autovacuum)[0] >= THRESHOLD, 15, message="dead tuples")
    vacuums = table_stats(no_autovacuum)[1]

    async def main() -> tuple[VacuumReport, VacuumReport, bool, str]:
        async with async_store(stranger_dsn) as store:
            vacuumer = Vacuumer(store, SETTINGS)
            first = await vacuumer.tick()
            second = await vacuumer.tick()
            # the VACUUM itself, asked anyway: the server only warns; we see that
            return first, second, vacuumer.allowed, await store.jobs_vacuum()

    first, second, allowed, direct = run_async(main)
    assert first.look is not None and first.look.may_vacuum is False
    assert first.outcome is None
    assert second.look is None, "a refused vacuumer looked again"
    assert allowed is False
    assert direct == "refused"
    assert table_stats(no_autovacuum)[1] == vacuums


def test_stopping_the_service_cancels_a_vacuum_under_way(no_autovacuum: str) -> None:
    """A VACUUM slowed to a crawl (cost delay for every new session of this database)
    is under way when the service stops: stop returns at once and the server's
    vacuum ends (psycopg sent the cancel request)."""
    dsn = no_autovacuum
    run_jobs_through(dsn, JOBS)
    wait_for(lambda: table_stats(dsn)[0] >= THRESHOLD, 15, message="dead tuples reported")
    vacuums = table_stats(dsn)[1]
    with connect(dsn) as conn:
        db = conn.execute("SELECT current_database() AS db").fetchone()
        assert db is not None
        conn.execute(
            sql.SQL(
                "ALTER DATABASE {} SET vacuum_cost_delay = '100ms'; "
                "ALTER DATABASE {} SET vacuum_cost_limit = 1"
            ).format(sql.Identifier(db["db"]), sql.Identifier(db["db"]))
        )

    def vacuuming() -> bool:
        with connect(dsn) as conn:
            row = conn.execute(
                "SELECT count(*) AS n FROM pg_stat_progress_vacuum"
                " WHERE relid = 'deadman.jobs'::regclass"
            ).fetchone()
            return bool(row and row["n"])

    async def main() -> float:
        store: AsyncStore
        async with async_store(dsn) as store:
            vacuumer = Vacuumer(store, SETTINGS)
            vacuumer.start()
            await wait_for_async(vacuuming, 20, message="the vacuum under way")
            started = time.monotonic()
            await asyncio.wait_for(vacuumer.stop(), 10)
            return time.monotonic() - started

    assert run_async(main) < 10
    wait_for(lambda: not vacuuming(), 10, message="the server's vacuum cancelled")
    assert table_stats(dsn)[1] == vacuums, "the crawling vacuum finished instead of being cancelled"


def test_claims_and_finishes_beside_back_to_back_vacuums_lose_and_double_nothing(
    no_autovacuum: str,
) -> None:
    """VACUUM changes no job's state and locks no row (the race matrix has no row for
    it: tests/integration/test_race_matrix.py's writers), but it removes the dead
    versions and index entries every claim and finish walks past: vacuums run one
    after another while jobs are claimed and finished in small batches, and every job
    must end succeeded with exactly one attempt."""
    dsn = no_autovacuum
    n = 3000
    enqueue(dsn, n)

    async def main() -> int:
        async with async_store(dsn) as store, async_store(dsn) as vacuum_store:
            cycling = asyncio.ensure_future(claim_and_finish(store, n, batch=25))
            vacuums = 0
            while not cycling.done():
                if await vacuum_store.jobs_vacuum() == "vacuumed" and not cycling.done():
                    vacuums += 1
            await cycling
            return vacuums

    assert run_async(main) >= 2, "no vacuum ran while the jobs were claimed"
    with connect(dsn) as conn:
        row = conn.execute(
            "SELECT count(*) FILTER (WHERE j.state = 'succeeded') AS succeeded,"
            " count(*) AS jobs, sum((SELECT count(*) FROM deadman.attempts a"
            " WHERE a.job_id = j.id)) AS attempts,"
            " count(*) FILTER (WHERE (SELECT count(*) FROM deadman.attempts a"
            " WHERE a.job_id = j.id) <> 1) AS not_once FROM deadman.jobs j"
        ).fetchone()
    assert row == {"succeeded": n, "jobs": n, "attempts": n, "not_once": 0}
