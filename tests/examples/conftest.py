"""The acceptance suite's process fixtures (``spawn_worker``: a real ``deadman
worker``), and its report hook, so a failed test prints its workers' log tails."""

from tests.acceptance.conftest import (  # noqa: F401 - fixtures and a hook, shared
    _spawner,
    pytest_runtest_makereport,
    spawn_worker,
)
