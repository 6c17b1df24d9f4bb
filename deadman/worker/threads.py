"""The threads sync handlers run in: one per job at a time, made as they are needed, up
to the worker's concurrency, and kept for the next job.

What ``loop.run_in_executor`` over a ``ThreadPoolExecutor`` gave, for less: a job
submitted gets an asyncio future that its thread's return or exception resolves, and a
job whose future was cancelled before a thread took it never runs. The pool's path paid,
per job, a ``concurrent.futures.Future`` (its condition and callbacks), the chaining of
that future to an asyncio one (a callback scheduled from the thread per job) and a
semaphore to find an idle thread. Here the loop's futures are resolved in batches: a
thread that finishes a job appends its outcome to one list and wakes the loop only if
no wake-up is pending, and the loop resolves every outcome the list holds (DECISIONS
104: a sync no-op job cost one worker ~61 µs of CPU, ~40 of them this hand-off).

Threads are daemons: a handler that ignores ``ctx.cancelled`` never holds the process
(or an application that embeds the worker) at exit. ``shutdown`` cancels what no
thread has taken yet and lets each thread end after the job it is running.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

R = TypeVar("R")

#: an outcome: the job's future, whether it returned, and its result or exception
_Outcome = tuple["asyncio.Future[Any]", bool, Any]
#: a job for a thread, or None: end
_Item = tuple["asyncio.Future[Any]", Callable[..., Any], tuple[Any, ...]] | None


class HandlerThreads:
    """Runs sync handlers in threads for one event loop; see the module's docstring."""

    def __init__(self, max_threads: int, name: str = "handler") -> None:
        if max_threads < 1:
            raise ValueError("max_threads must be at least 1")
        self._max = max_threads
        self._name = name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._items: queue.SimpleQueue[_Item] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._idle = 0  # threads done with their job and not yet given another
        self._done: list[_Outcome] = []
        self._wake_pending = False
        self._closed = False

    @property
    def threads(self) -> int:
        """Threads started so far (at most ``max_threads``)."""
        return len(self._threads)

    def submit(self, fn: Callable[..., R], *args: Any) -> asyncio.Future[R]:
        """Run ``fn(*args)`` in a thread; call on the loop's thread."""
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
        elif self._loop is not loop:
            raise RuntimeError("HandlerThreads serves the one event loop it was first used on")
        fut: asyncio.Future[R] = loop.create_future()
        with self._lock:
            if self._closed:
                raise RuntimeError("cannot run a handler after shutdown")
            if self._idle:
                self._idle -= 1
                start = False
            else:
                start = len(self._threads) < self._max
        if start:
            thread = threading.Thread(
                target=self._serve, name=f"{self._name}_{len(self._threads)}", daemon=True
            )
            self._threads.append(thread)
            thread.start()
        self._items.put((fut, fn, args))
        return fut

    def shutdown(self) -> None:
        """No more jobs: what no thread has taken is cancelled (on the loop's thread),
        idle threads end now and busy ones after their job."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        while True:
            try:
                item = self._items.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                item[0].cancel()
        for _ in self._threads:
            self._items.put(None)

    def _serve(self) -> None:
        while True:
            item = self._items.get()
            if item is None:
                return
            fut, fn, args = item
            if fut.cancelled():  # read only: a cancel after this runs the job anyway, as a pool's
                outcome: _Outcome | None = None
            else:
                try:
                    outcome = (fut, True, fn(*args))
                except BaseException as exc:  # a handler's SystemExit is the job's outcome
                    outcome = (fut, False, exc)
            with self._lock:
                if outcome is not None:
                    self._done.append(outcome)
                wake = outcome is not None and not self._wake_pending
                if wake:
                    self._wake_pending = True
                self._idle += 1
            if wake:
                self._wake()

    def _wake(self) -> None:
        loop = self._loop
        if loop is None:
            return
        try:
            loop.call_soon_threadsafe(self._resolve)
        except RuntimeError:  # the loop is closed: nobody waits for these outcomes
            with self._lock:
                self._done.clear()
                self._wake_pending = False

    def _resolve(self) -> None:
        with self._lock:
            done, self._done = self._done, []
            self._wake_pending = False
        for fut, returned, value in done:
            if fut.done():
                continue
            if returned:
                fut.set_result(value)
            elif isinstance(value, StopIteration):  # a future refuses it (TypeError)
                refused = RuntimeError(f"the handler raised {value!r}")
                refused.__cause__ = value
                fut.set_exception(refused)
            else:
                fut.set_exception(value)
