"""Retention keeps up with a busy queue: one prune round deletes batch after batch
until a batch comes back short (one batch per round capped pruning at ~100 jobs/s,
and the table grew without bound under a faster steady load)."""

from __future__ import annotations

import pytest

from deadman.config import Settings
from deadman.maintenance import Cleaner, cleaner
from deadman.store import PruneParams
from tests.factories import async_store, connect, run_async


def _seed_old_successes(dsn: str, n: int) -> None:
    with connect(dsn) as conn:
        conn.execute(
            "INSERT INTO deadman.jobs (type, state, attempt, started_at, finished_at)"
            " SELECT 'seed', 'succeeded', 1, now() - interval '3 days',"
            " now() - interval '2 days' FROM generate_series(1, %s)",
            (n,),
        )


def _count(dsn: str) -> int:
    with connect(dsn) as conn:
        row = conn.execute("SELECT count(*) AS n FROM deadman.jobs").fetchone()
    assert row is not None
    return int(row["n"])


def test_one_round_prunes_past_the_batch_limit(db_dsn: str) -> None:
    limit = PruneParams(succeeded_ms=0, failed_ms=0).limit
    _seed_old_successes(db_dsn, 3 * limit + 17)

    async def main() -> int:
        async with async_store(db_dsn) as store:
            return (await Cleaner(store, Settings()).tick()).pruned

    assert run_async(main) == 3 * limit + 17
    assert _count(db_dsn) == 0


def test_a_round_stops_after_the_batch_cap(db_dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    limit = PruneParams(succeeded_ms=0, failed_ms=0).limit
    monkeypatch.setattr(cleaner, "PRUNE_BATCHES_MAX", 2)
    _seed_old_successes(db_dsn, 3 * limit)

    async def main() -> int:
        async with async_store(db_dsn) as store:
            return (await Cleaner(store, Settings()).tick()).pruned

    assert run_async(main) == 2 * limit
    assert _count(db_dsn) == limit
