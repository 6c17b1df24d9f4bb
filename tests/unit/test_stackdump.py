"""deadman.stackdump.request_dump returns a dump whole: every thread's part, and the
event loop's tasks up to their END line, however the process spaces its writes.
A suite run once asserted on a dump cut after its first thread (the main thread's
part had not been written yet)."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from deadman import stackdump
from tests.helpers import wait_for

#: A stand-in for a Deadman process: on SIGUSR1 it writes one thread's part, waits
#: (less than QUIET_S), writes another's, and (with "loop") the loop's part and its
#: end line (argv[3]).
FAKE = r"""
import signal, sys, time
loop = sys.argv[1] == "loop"
def dump(signum, frame):
    sys.stderr.write('Thread 0x1 (most recent call first):\n  File "a.py", line 1 in f\n\n')
    sys.stderr.flush()
    time.sleep(float(sys.argv[2]))
    sys.stderr.write('Current thread 0x2 (most recent call first):\n  File "b.py", line 2 in g\n')
    sys.stderr.flush()
    if loop:
        time.sleep(float(sys.argv[2]))
        sys.stderr.write("Event loop tasks (1, coroutines innermost last):\n1 task:\n")
        sys.stderr.write(sys.argv[3] + "\n")
        sys.stderr.flush()
signal.signal(signal.SIGUSR1, dump)
print("ready", flush=True)
while True:
    signal.pause()  # until the next signal (the test kills it at the end)
"""


#: Windows has no SIGUSR1: no stack dump is installed there to ask for.
NEEDS_SIGUSR1 = pytest.mark.skipif(
    not hasattr(signal, "SIGUSR1"), reason="Windows has no SIGUSR1: no stack dump to ask for"
)


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[tuple[Path, list[subprocess.Popen[str]]]]:
    started: list[subprocess.Popen[str]] = []
    yield tmp_path / "err.log", started
    for proc in started:
        proc.kill()
        proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()


def _start(
    log: Path, started: list[subprocess.Popen[str]], program: str, *args: str
) -> subprocess.Popen[str]:
    """Start ``program`` (stderr to ``log``; stopped by the ``fake`` fixture) and wait
    until it says it is ready."""
    with log.open("w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-c", program, *args],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )
    started.append(proc)
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    return proc


@NEEDS_SIGUSR1
def test_a_dump_written_in_pieces_comes_back_whole(
    fake: tuple[Path, list[subprocess.Popen[str]]],
) -> None:
    log, started = fake
    gap = stackdump.QUIET_S / 3
    pid = _start(log, started, FAKE, "threads", str(gap), stackdump.END).pid
    dump = stackdump.request_dump(pid, log, timeout=10)
    assert "Thread 0x1" in dump and "Current thread 0x2" in dump, dump

    pid = _start(log, started, FAKE, "loop", str(gap), stackdump.END).pid
    dump = stackdump.request_dump(pid, log, timeout=10)
    assert "Current thread 0x2" in dump, dump
    assert dump.rstrip().endswith(stackdump.END), dump


@NEEDS_SIGUSR1
def test_no_dump_is_empty(tmp_path: Path) -> None:
    """A process gone (or one that never answers) gives nothing, within the timeout."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait(10)
    assert stackdump.request_dump(proc.pid, tmp_path / "none.log", timeout=1) == ""


#: A process as busy as a worker in a burst of jobs: two threads and the main thread
#: all running Python, with Deadman's dump installed.
BUSY = r"""
import sys, threading
from deadman import stackdump
def deep(n):
    return 0 if n == 0 else deep(n - 1) + 1
def spin():
    while True:
        deep(200)
for _ in range(2):
    threading.Thread(target=spin, daemon=True).start()
assert stackdump.dump_stacks_on_sigusr1()
print("ready", flush=True)
while True:
    deep(300)
"""


@NEEDS_SIGUSR1
def test_a_burst_of_signals_to_a_busy_process_leaves_it_running(
    fake: tuple[Path, list[subprocess.Popen[str]]],
) -> None:
    """The interpreter's C-level dump (``faulthandler.register``) reads other threads'
    frames while they run: this process died of SIGSEGV at the 6th signal with it, in
    2 runs of 3. Deadman's dump runs in the main thread with the GIL held."""
    log, started = fake
    proc = _start(log, started, BUSY)
    for i in range(50):  # one at a time: signals sent together arrive as one
        size = log.stat().st_size
        proc.send_signal(signal.SIGUSR1)
        wait_for(
            lambda size=size: proc.poll() is not None or _ended(log, size),  # type: ignore[misc]
            10,
            interval=0.001,
            message=f"signal {i}'s dump to end",
        )
        assert proc.poll() is None, f"exit {proc.returncode} at signal {i}"
    dump = stackdump.request_dump(proc.pid, log, timeout=10)
    assert proc.poll() is None, f"exit {proc.returncode}"
    assert dump.count("\nThread 0x") == 2 and dump.count("Current thread 0x") == 1, dump
    assert dump.rstrip().endswith(stackdump.END), dump


def _ended(log: Path, size: int) -> bool:
    """The log has grown past ``size`` and ends a dump."""
    with log.open("rb") as f:
        f.seek(size)
        return f.read().rstrip().endswith(stackdump.END.encode())
