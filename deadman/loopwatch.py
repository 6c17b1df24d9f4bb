"""Says when something blocks a long-running process's event loop, and what.

A worker's async handlers, heartbeat, claims and completions share one event loop. An
async handler that blocks it (``time.sleep``, a blocking client, a long CPU loop)
stops all of them: no job starts or finishes, and no lease is renewed, so past the
trust window every job the worker holds is given up and runs again elsewhere.
``deadman serve`` answers every request on one loop too, so a blockage there is every
request's latency. Nothing else says why. Both run a watch (the worker with its tasks,
serve in the app's lifespan).

Two parts:
- a tick on the loop every ``interval_s``, which records when it ran; one that runs
  ``threshold_s`` or more late ends a blockage, logged as ``event_loop_blocked_for``
  with its length and counted in ``deadman_event_loop_blocked_seconds``;
- a thread that looks every ``interval_s``: once the loop has not ticked for
  ``threshold_s``, it reads the loop thread's Python stack (``sys._current_frames``,
  with the GIL, so the frames hold still) and logs it as ``event_loop_blocked`` (its
  ``frames``), once per blockage, while it is still going on. The innermost frames
  name the culprit.

A stack that ends in the loop's own code (``in_loop``) names no culprit: the loop was
waiting for I/O while the process got no CPU (a loaded machine, a paused VM) or the
GIL was held elsewhere, or it was busy scheduling more ready work than it could run.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
import traceback
from types import FrameType

from prometheus_client import Histogram

from deadman import logs

log = logs.get("deadman.loopwatch")

#: Here rather than in deadman.metrics, which is the worker's: ``deadman serve`` has
#: a watch too. A plain Histogram: it is observed once per blockage, not per job.
BLOCKED = Histogram(
    "deadman_event_loop_blocked_seconds",
    "How long this process's event loop was blocked (a worker's heartbeats, claims and"
    " completions with it; deadman serve's requests), each time it was for 0.5 s or more",
    buckets=(0.5, 1, 2.5, 5, 10, 30, 60, 300),
)

#: how often the loop ticks and the thread looks
INTERVAL_S = 0.1
#: how late a tick must be to count as a blockage: five ticks missed, well past a GC
#: pause, well short of any lease's trust window
THRESHOLD_S = 0.5
#: innermost frames logged
STACK_FRAMES = 12


class LoopWatch:
    """See the module's docstring. ``start`` on the loop's thread, ``stop`` anywhere."""

    def __init__(self, threshold_s: float = THRESHOLD_S, interval_s: float = INTERVAL_S) -> None:
        self._threshold = threshold_s
        self._interval = interval_s
        self._last = time.monotonic()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0
        self._handle: asyncio.TimerHandle | None = None
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        #: the blockage the thread already reported (its last tick's time), if any
        self._reported: float | None = None

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._last = time.monotonic()
        self._handle = self._loop.call_later(self._interval, self._tick)
        self._thread = threading.Thread(target=self._watch, name="loopwatch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        if self._handle is not None:
            self._handle.cancel()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=2 * self._interval + 1.0)

    def _tick(self) -> None:
        now = time.monotonic()
        late = now - self._last - self._interval
        if late >= self._threshold:
            BLOCKED.observe(late)
            log.warning("event_loop_blocked_for", blocked_ms=round(late * 1000))
        self._last = now
        if self._loop is not None and not self._stopped.is_set():
            self._handle = self._loop.call_later(self._interval, self._tick)

    def _watch(self) -> None:
        while not self._stopped.wait(self._interval):
            last = self._last
            if self._loop is None or not self._loop.is_running():
                continue  # stopped or gone: nothing of its own to block it
            if self._reported == last:
                continue  # this blockage is reported; the tick logs its end
            blocked = time.monotonic() - last - self._interval
            if blocked < self._threshold:
                continue
            self._reported = last
            frames, in_loop = loop_stack(self._loop_thread)
            log.warning(
                "event_loop_blocked",
                blocked_ms=round(blocked * 1000),
                frames=frames,
                in_loop=in_loop,
            )


def loop_stack(thread_id: int, limit: int = STACK_FRAMES) -> tuple[list[str], bool]:
    """The innermost ``limit`` frames of the thread's Python stack as ``file:line
    function``, innermost last, and whether the innermost is the event loop's own
    code (waiting for I/O, or scheduling its callbacks: no handler's line to name)."""
    frame: FrameType | None = sys._current_frames().get(thread_id)
    if frame is None:
        return [], False
    summary = traceback.extract_stack(frame, limit=limit)
    return [f"{f.filename}:{f.lineno} {f.name}" for f in summary], _in_the_loop(frame)


def _in_the_loop(frame: FrameType) -> bool:
    """The innermost frame is the loop's own: asyncio's selector wait, or, for uvloop
    (whose loop is C), the asyncio frame that called it."""
    path = frame.f_code.co_filename.replace("\\", "/")
    return "/asyncio/" in path or "/uvloop/" in path or path.endswith("/selectors.py")
