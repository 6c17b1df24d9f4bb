"""``kill -USR1 <pid>``: a worker, a fleet's supervisor or ``deadman serve`` writes
every thread's Python stack to its stderr and carries on.

For a process that looks hung (no log lines, jobs not moving) when nothing else can say
where it is. The dump is written by a Python signal handler, so in the main thread
with the GIL held: a main thread blocked in a system call or on a lock is interrupted
and answers, and no other thread can run Python while its stack is read. (The
interpreter's own ``faulthandler.register(all_threads=True)`` writes from the C signal
handler, in whichever thread the signal lands on, while the others run: it reads
their frames as they change, and a burst of signals to a busy worker crashed it with
SIGSEGV. DECISIONS 97, third addendum.) A main thread stuck in C code that holds the
GIL does not answer.

A thread's stack shows an idle event loop as just that: every coroutine waiting in
it is invisible there. So a worker's dump adds the loop's tasks
(:func:`dump_stacks_on_sigusr1` given the loop): every task, with the coroutines it
waits in, identical ones counted once. Every dump ends with :data:`END`. Where SIGUSR1
does not exist (Windows), outside the main thread, or where stderr is not a file,
nothing is installed.
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
from types import FrameType
from typing import Any

#: the last line of every dump
END = "-- end of the stack dump --"
#: a dump cut short (a process that died writing it) is taken as it is once its log
#: has been quiet this long
QUIET_S = 0.25


def dump_stacks_on_sigusr1(loop: asyncio.AbstractEventLoop | None = None) -> bool:
    """Install the dump, with ``loop``'s tasks after the threads if one is given (a
    later call replaces an earlier one). True if it is installed."""
    sig = getattr(signal, "SIGUSR1", None)
    if sig is None or sys.stderr is None:
        return False
    try:
        fd = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        return False  # stderr without a file descriptor (a test runner's capture)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        _write_dump(fd, loop)

    try:
        signal.signal(sig, on_signal)
    except (ValueError, OSError):
        return False  # not the main thread: signal handlers can only be set there
    return True


def _write_dump(fd: int, loop: asyncio.AbstractEventLoop | None = None) -> None:
    """Write every thread's stack to ``fd``, then ``loop``'s tasks, then END. Written
    to the descriptor, not through ``sys.stderr``: the signal may have interrupted a
    write to it, and its buffer refuses a reentrant one."""
    try:
        _write(fd, "\n")  # off whatever line the interrupted write left open
        faulthandler.dump_traceback(fd, all_threads=True)
        _write(fd, ("" if loop is None else _tasks_text(loop)) + END + "\n")
    except OSError:
        pass  # stderr gone: nothing to tell


def _write(fd: int, text: str) -> None:
    data = text.encode(errors="replace")
    while data:
        data = data[os.write(fd, data) :]


def _tasks_text(loop: asyncio.AbstractEventLoop) -> str:
    """The loop's tasks: each distinct stack of coroutines once, with how many tasks
    wait there (a worker's thousand jobs are a few lines)."""
    stacks: Counter[tuple[str, ...]] = Counter()
    for task in asyncio.all_tasks(loop):
        stacks[_awaiting(task.get_coro())] += 1
    lines = [f"Event loop tasks ({sum(stacks.values())}, coroutines innermost last):"]
    for frames, n in stacks.most_common():
        lines.append(f"{n} task{'s' if n > 1 else ''}:")
        lines.extend(frames or ("  (no coroutine: done, or not started)",))
    return "\n".join(lines) + "\n"


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
            # The threads are written one by one: whole at END, or (a process that
            # died writing it) once the log has stopped growing for QUIET_S.
            if END in text:
                return text
            if len(text) != seen:
                seen, quiet_since = len(text), now
            elif now - quiet_since >= QUIET_S:
                return text
        if now >= deadline:
            return text if seen >= 0 else ""
        time.sleep(0.05)
