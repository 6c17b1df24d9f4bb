"""The fleet supervisor with stand-in children (real processes, no database)."""

from __future__ import annotations

import sys
import time

from deadman import cli
from deadman.worker.fleet import EXIT_MISCONFIGURED, Fleet

# child 0 exits as a worker does on a configuration error; child 1 runs until signalled
CHILD = [
    sys.executable,
    "-c",
    "import os, sys, time\n"
    "if os.environ['DEADMAN_FLEET_INDEX'] == '0': sys.exit(2)\n"
    "time.sleep(60)\n",
]


def test_a_misconfigured_child_stops_the_fleet_instead_of_a_restart_loop() -> None:
    assert cli.EXIT_USAGE == EXIT_MISCONFIGURED
    fleet = Fleet(2, CHILD)
    started = time.monotonic()
    code = fleet.run()
    assert code == EXIT_MISCONFIGURED
    assert time.monotonic() - started < 20
    assert all(c.restarts == 0 for c in fleet.children)
