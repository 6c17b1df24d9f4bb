"""Acceptance fixtures: real ``deadman worker`` and ``deadman rescuer`` processes
against a real database, started through tests.helpers.processes. At teardown every
process group is SIGKILLed (a SIGSTOPped zombie or an orphaned fleet child included)
and, if the test failed, the tail of each log is printed so the failure can be read
without re-running it.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.processes import APP, Proc, Spawner, SpawnRescuer, SpawnWorker


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    # Remember each phase's report on the item, so teardown knows if the test failed.
    rep = yield
    setattr(item, f"rep_{rep.when}", rep)
    return rep


@pytest.fixture
def _spawner(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Spawner]:
    spawner = Spawner(tmp_path)
    try:
        yield spawner
    finally:
        spawner.kill_all()
        rep = getattr(request.node, "rep_call", None)
        if rep is None or rep.failed:
            for proc in spawner.procs:
                sys.stderr.write(
                    f"\n----- {proc.name} (pid {proc.pid}, exit {proc.popen.returncode}) "
                    f"{' '.join(proc.argv[2:4])} log tail -----\n{proc.tail()}\n"
                )


@pytest.fixture
def spawn_worker(_spawner: Spawner) -> SpawnWorker:
    """``spawn_worker(db_dsn, processes=1, concurrency=10, DEADMAN_POLL_S=30, ...)``:
    start ``deadman worker`` with the test timings (keyword env vars override them)."""
    counter = iter(range(1000))

    def spawn(
        dsn: str,
        *,
        processes: int = 1,
        concurrency: int | None = 10,
        queues: str | None = None,
        app: str | None = APP,
        no_rescuer: bool = False,
        name: str | None = None,
        **env: str | float | int,
    ) -> Proc:
        args = ["worker", "--database-url", dsn, "--processes", str(processes)]
        if concurrency is not None:
            args += ["--concurrency", str(concurrency)]
        if queues is not None:
            args += ["--queues", queues]
        if app is not None:
            args += ["--app", app]
        if no_rescuer:
            args.append("--no-rescuer")
        return _spawner.start(args, name or f"worker{next(counter)}", env)

    return spawn


@pytest.fixture
def spawn_rescuer(_spawner: Spawner) -> SpawnRescuer:
    """Start ``deadman rescuer`` standalone with the test timings."""

    def spawn(dsn: str, *, name: str | None = None, **env: str | float | int) -> Proc:
        return _spawner.start(["rescuer", "--database-url", dsn], name or "rescuer", env)

    return spawn
