"""``deadman worker --processes N``: launch and supervise N worker processes.

A child that exits on its own (crash, OOM kill, SIGKILL) is restarted with
exponential backoff, reset once it has stayed up for a while. SIGTERM/SIGINT are
forwarded; a second signal is forwarded too (the children then exit at once).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import FrameType

from deadman import logs
from deadman.stackdump import dump_stacks_on_sigusr1

log = logs.get("deadman.fleet")

STABLE_AFTER_S = 30.0
MAX_BACKOFF_S = 30.0
#: a child's exit code for a usage or configuration error (cli.EXIT_USAGE)
EXIT_MISCONFIGURED = 2


@dataclass
class Child:
    index: int
    proc: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    backoff_s: float = 0.5
    restart_at: float = 0.0
    restarts: int = field(default=0)


class Fleet:
    def __init__(self, n: int, child_argv: Sequence[str]) -> None:
        self.children = [Child(i) for i in range(n)]
        self.child_argv = list(child_argv)
        self.stopping = False
        self.signals = 0

    def _spawn(self, child: Child) -> None:
        env = dict(os.environ, DEADMAN_FLEET_INDEX=str(child.index))
        child.proc = subprocess.Popen(self.child_argv, env=env)
        child.started_at = time.monotonic()
        log.info("fleet_child_started", index=child.index, pid=child.proc.pid)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.signals += 1
        self.stopping = True
        for c in self.children:
            if c.proc is not None and c.proc.poll() is None:
                c.proc.send_signal(signum)

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        dump_stacks_on_sigusr1()  # the supervisor's own; each child dumps its own
        for c in self.children:
            self._spawn(c)
        worst = 0
        while True:
            alive = 0
            now = time.monotonic()
            for c in self.children:
                if c.proc is None:
                    if not self.stopping and now >= c.restart_at:
                        c.restarts += 1
                        self._spawn(c)
                        alive += 1
                    continue
                code = c.proc.poll()
                if code is None:
                    alive += 1
                    continue
                if self.stopping:
                    # A child still starting up dies of the forwarded signal itself
                    # (its handlers are not installed yet): that is a clean stop too.
                    clean = code in (0, -signal.SIGTERM, -signal.SIGINT)
                    worst = max(worst, 0 if clean else 1)
                    c.proc = None
                    continue
                if code == EXIT_MISCONFIGURED:
                    # A configuration error fails the same way on every restart: stop
                    # the fleet and say so (exit 2), instead of a restart loop for ever.
                    log.error("fleet_child_misconfigured", index=c.index, pid=c.proc.pid)
                    c.proc = None
                    worst = EXIT_MISCONFIGURED
                    self._on_signal(signal.SIGTERM, None)
                    self.signals = 0
                    continue
                up = now - c.started_at
                if up >= STABLE_AFTER_S:
                    c.backoff_s = 0.5
                log.warning(
                    "fleet_child_exited",
                    index=c.index,
                    pid=c.proc.pid,
                    code=code,
                    restart_in_s=c.backoff_s,
                )
                c.proc = None
                c.restart_at = now + c.backoff_s
                c.backoff_s = min(c.backoff_s * 2, MAX_BACKOFF_S)
                alive += 1  # it will be back
            if self.stopping and alive == 0:
                return worst
            time.sleep(0.1)


def child_command(argv: Sequence[str]) -> list[str]:
    """The same ``deadman worker`` command line, for one process."""
    return [sys.executable, "-m", "deadman", "worker", "--processes", "1", *argv]
