"""``kill -USR1 <pid>``: a worker, a fleet's supervisor or ``deadman serve`` writes
every thread's Python stack to its stderr and carries on.

For a process that looks hung (no log lines, jobs not moving) when nothing else can say
where it is: the interpreter's own fault handler writes the dump from its C signal
handler, so it works even when the event loop is blocked, a lock is held or the GIL is
stuck in a thread. Where SIGUSR1 does not exist (Windows), or stderr is not a file,
nothing is installed.

A thread's stack shows an idle event loop as just that: every coroutine waiting in
it is invisible there. So a worker's loop adds its own part once the threads' is
written (:func:`dump_tasks_on_sigusr1`): every task, with the coroutines it waits
in, identical ones counted once, and then :data:`END` (a loop that is blocked writes
nothing more; the threads' part says where it is).
"""

from __future__ import annotations

import asyncio
import faulthandler
import os
import signal
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

#: the last line of a loop's part of the dump
END = "-- end of the event loop's tasks --"
#: a dump with no loop part is whole once its log has been quiet this long
QUIET_S = 0.25


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


def dump_tasks_on_sigusr1(loop: asyncio.AbstractEventLoop) -> bool:
    """Install the dump as :func:`dump_stacks_on_sigusr1` does, followed by the tasks of
    ``loop`` (module docstring); call it from the running loop. True if installed.
    The fault handler chains to the loop's signal handler, so the threads are written
    first, from the signal handler itself, and the tasks when the loop next runs."""
    sig = getattr(signal, "SIGUSR1", None)
    if sig is None or sys.stderr is None:
        return False
    try:
        faulthandler.unregister(sig)  # so that the loop's handler is the one it chains to
        loop.add_signal_handler(sig, write_tasks, loop)
        faulthandler.register(sig, file=sys.stderr, all_threads=True, chain=True)
    except (AttributeError, NotImplementedError, OSError, ValueError, RuntimeError):
        return dump_stacks_on_sigusr1()
    return True


def write_tasks(loop: asyncio.AbstractEventLoop) -> None:
    """Write the loop's tasks to stderr: each distinct stack of coroutines once, with how
    many tasks wait there (a worker's thousand jobs are a few lines), then END."""
    stacks: Counter[tuple[str, ...]] = Counter()
    for task in asyncio.all_tasks(loop):
        stacks[_awaiting(task.get_coro())] += 1
    lines = [f"Event loop tasks ({sum(stacks.values())}, coroutines innermost last):"]
    for frames, n in stacks.most_common():
        lines.append(f"{n} task{'s' if n > 1 else ''}:")
        lines.extend(frames or ("  (no coroutine: done, or not started)",))
    lines.append(END)
    try:
        sys.stderr.write("\n".join(lines) + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass  # stderr gone: nothing to tell


def _awaiting(coro: Any, limit: int = 40) -> tuple[str, ...]:
    """The coroutines ``coro`` waits in, outermost first, and what the innermost
    awaits. ``Task.get_stack`` gives a suspended coroutine's own frame only."""
    lines: list[str] = []
    while coro is not None and len(lines) < limit:
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
        if frame is None:
            lines.append(f"  awaiting {type(coro).__name__}")
            break
        code = frame.f_code
        lines.append(f'  File "{code.co_filename}", line {frame.f_lineno} in {code.co_name}')
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
    return tuple(lines)


def request_dump(pid: int, log_path: Path, timeout: float = 5.0) -> str:
    """Ask the Deadman process ``pid``, whose stderr goes to ``log_path``, for its
    stacks: what it wrote there from the request on, once the dump is whole (see the
    loop below); empty if none came within ``timeout`` (or the process is gone, or
    there is no SIGUSR1).
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
    seen = -1  # the text's length at the last read, once the dump has begun
    quiet_since = 0.0
    while True:
        try:
            with log_path.open("rb") as log:
                log.seek(before)
                text = log.read().decode(errors="replace")
        except OSError:
            return ""
        now = time.monotonic()
        if "most recent call first" in text:
            # The threads are written one by one: whole once the loop's part has
            # ended, or (a process with no loop part, or a blocked loop) once the log
            # has stopped growing for QUIET_S.
            if END in text:
                return text
            if len(text) != seen:
                seen, quiet_since = len(text), now
            elif now - quiet_since >= QUIET_S:
                return text
        if now >= deadline:
            return text if seen >= 0 else ""
        time.sleep(0.05)
