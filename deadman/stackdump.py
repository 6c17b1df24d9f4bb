"""``kill -USR1 <pid>``: a worker, a fleet's supervisor or ``deadman serve`` writes
every thread's Python stack to its stderr and carries on.

For a process that looks hung (no log lines, jobs not moving) when nothing else can say
where it is: the interpreter's own fault handler writes the dump from its C signal
handler, so it works even when the event loop is blocked, a lock is held or the GIL is
stuck in a thread. Where SIGUSR1 does not exist (Windows), or stderr is not a file,
nothing is installed.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
import time
from pathlib import Path


def dump_stacks_on_sigusr1() -> bool:
    """Install the dump; True if it is installed."""
    sig = getattr(signal, "SIGUSR1", None)
    if sig is None or sys.stderr is None:
        return False
    try:
        faulthandler.register(sig, file=sys.stderr, all_threads=True, chain=False)
    except (AttributeError, OSError, ValueError, RuntimeError):
        return False  # stderr without a file descriptor (a test runner's capture)
    return True


def request_dump(pid: int, log_path: Path, timeout: float = 5.0) -> str:
    """Ask the Deadman process ``pid``, whose stderr goes to ``log_path``, for its
    stacks: what it wrote there from the request on, once the dump is in it; empty if
    none came within ``timeout`` (or the process is gone, or there is no SIGUSR1).
    A process still importing has not installed the dump yet, and SIGUSR1 ends it."""
    sig = getattr(signal, "SIGUSR1", None)
    if sig is None:
        return ""
    try:
        before = log_path.stat().st_size
        os.kill(pid, sig)
    except OSError:
        return ""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with log_path.open("rb") as log:
                log.seek(before)
                text = log.read().decode(errors="replace")
        except OSError:
            return ""
        if "most recent call first" in text:
            return text
        if time.monotonic() >= deadline:
            return ""
        time.sleep(0.05)
