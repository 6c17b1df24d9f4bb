"""deadman.loopwatch.loop_stack: what the watch reads from the loop's thread,
on uvloop (the worker's default) and on asyncio's own loop."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import uvloop

from deadman.loopwatch import loop_stack
from tests.helpers import wait_for

LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "uvloop": uvloop.new_event_loop,
    "asyncio": asyncio.new_event_loop,
}


@contextmanager
def loop_thread(
    factory: Callable[[], asyncio.AbstractEventLoop],
    main: Callable[[threading.Event], Coroutine[Any, Any, None]],
) -> Iterator[int]:
    """Run ``main(started)`` on a loop of ``factory`` in a thread; yields the thread's
    id once ``main`` set ``started``."""
    started = threading.Event()

    def run() -> None:
        with asyncio.Runner(loop_factory=factory) as runner:
            runner.run(main(started))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        assert started.wait(10), "the loop's coroutine did not start"
        assert thread.ident is not None
        yield thread.ident
    finally:
        thread.join(10)


def blocking_handler(started: threading.Event) -> None:
    started.set()
    time.sleep(1.0)  # what the watch exists for: the loop cannot run meanwhile


@pytest.mark.parametrize("loop", sorted(LOOPS))
def test_a_blocked_loop_is_read_down_to_the_blocking_line(loop: str) -> None:
    async def main(started: threading.Event) -> None:
        blocking_handler(started)

    with loop_thread(LOOPS[loop], main) as tid:
        frames, in_loop = loop_stack(tid)
    assert not in_loop, frames
    assert frames[-1].endswith(" blocking_handler"), frames
    assert "test_loopwatch.py" in frames[-1]
    assert any(f.endswith(" main") for f in frames), frames


@pytest.mark.parametrize("loop", sorted(LOOPS))
def test_an_idle_loop_names_no_culprit(loop: str) -> None:
    release = threading.Event()

    async def main(started: threading.Event) -> None:
        started.set()
        # idle in the loop's own wait (for a thread's answer), not blocked
        await asyncio.get_running_loop().run_in_executor(None, release.wait, 10)

    def waiting(tid: int) -> tuple[list[str], bool] | None:
        read = loop_stack(tid)
        return read if read[1] else None

    try:
        with loop_thread(LOOPS[loop], main) as tid:
            # the coroutine set the event and is about to await: poll until it did
            frames, in_loop = wait_for(lambda: waiting(tid), 5, message="the loop to wait")
            release.set()
    finally:
        release.set()
    assert in_loop, frames
    assert "test_loopwatch.py" not in frames[-1], frames
