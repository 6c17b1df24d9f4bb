"""The harness's worker pool (deadman/chaos/workers.py) asked for a worker's stacks:
what an episode reports when the worker it waits on never takes a lease (it may be
stuck, not idle)."""

from __future__ import annotations

from pathlib import Path

from deadman.chaos.probe import Db
from deadman.chaos.workers import WorkerPool
from tests.helpers import wait_for


def test_a_live_workers_stacks_come_from_its_own_log_and_it_carries_on(
    db_dsn: str, tmp_path: Path
) -> None:
    # the harness's logging: JSON, warnings only (a dump is written whatever the level)
    env = {"DEADMAN_LOG_FORMAT": "json", "DEADMAN_LOG_LEVEL": "warning"}
    pool = WorkerPool(db_dsn, 1, env, tmp_path)
    try:
        pool.start_all()
        proc = pool.slots[0].proc
        assert proc is not None
        # registered: past its start, where it installs the dump (before that, SIGUSR1
        # would end it, as it ends any process that has not taken the signal)
        db = Db(db_dsn)
        wait_for(lambda: db.value("worker_id_of_pid", {"pid": proc.pid}), 30.0, interval=0.05)
        stacks = pool.stacks(0)
        assert "most recent call first" in stacks and "in cmd_worker" in stacks
        assert proc.poll() is None  # a dump, not the end of it
        pool.kill(0)
        assert pool.stacks(0) == ""  # gone: nothing to ask
    finally:
        pool.stop_all()
