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
import signal
import sys


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
