"""Cron across a fleet of real processes: three workers, each running the scheduler
(as every worker's maintenance services do), declare the same every-second schedule
in code; one is SIGKILLed and started again while it runs. Every tick in the span is
enqueued exactly once, checked against the schedule's own arithmetic (whole seconds
since the epoch), none twice, none skipped."""

from __future__ import annotations

import signal
from datetime import datetime, timedelta
from itertools import pairwise

from tests.helpers import wait_for
from tests.helpers.processes import SpawnWorker, sql_all, sql_value, wait_registered

APP = "tests.acceptance.cron_app:registry"
PREFIX = "schedule:every-second:"


def _ticks(dsn: str) -> list[datetime]:
    rows = sql_all(
        dsn,
        "SELECT idempotency_key FROM deadman.jobs WHERE idempotency_key LIKE %s",
        (PREFIX + "%",),
    )
    return sorted(
        datetime.fromisoformat(r["idempotency_key"].removeprefix(PREFIX).replace("Z", "+00:00"))
        for r in rows
    )


def test_every_tick_once_across_a_fleet_with_a_kill(db_dsn: str, spawn_worker: SpawnWorker) -> None:
    workers = [spawn_worker(db_dsn, app=APP, queues="cron") for _ in range(3)]
    for w in workers:
        wait_registered(db_dsn, w.pid)
    wait_for(lambda: len(_ticks(db_dsn)) >= 4, timeout=30, message="the first ticks")
    workers[0].send(signal.SIGKILL)
    workers[0].wait_exit(10)
    seen = len(_ticks(db_dsn))
    wait_for(lambda: len(_ticks(db_dsn)) >= seen + 3, timeout=30, message="ticks after the kill")
    again = spawn_worker(db_dsn, app=APP, queues="cron")  # declares the schedule again
    wait_registered(db_dsn, again.pid)
    seen = len(_ticks(db_dsn))
    wait_for(lambda: len(_ticks(db_dsn)) >= seen + 4, timeout=30, message="ticks after restart")
    ticks = _ticks(db_dsn)
    assert len(ticks) == len(set(ticks)) >= 11
    assert all(t.microsecond == 0 for t in ticks)  # the schedule's own arithmetic
    gaps = [b - a for a, b in pairwise(ticks)]
    assert set(gaps) == {timedelta(seconds=1)}, gaps  # none skipped, none twice
    # every tick's job ran (the fleet serves the queue) or is about to
    wait_for(
        lambda: sql_value(
            db_dsn,
            "SELECT count(*) = 0 FROM deadman.jobs WHERE idempotency_key LIKE %s"
            " AND state NOT IN ('succeeded', 'running', 'queued')",
            (PREFIX + "%",),
        ),
        timeout=30,
        message="the tick jobs to run",
    )
