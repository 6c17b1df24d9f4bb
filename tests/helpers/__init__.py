"""Helpers shared by the test suites, by role: ``api`` (a served app and its clients),
``worker`` (a Worker in a thread, its test handlers), ``workflows`` (graphs built by
hand), ``plans`` (EXPLAIN on a seeded copy), ``processes`` (real deadman processes for
the acceptance tests). Test modules import from here, never from one another.
``wait_for`` and ``wait_for_async`` live here: the only ways a test waits."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar, cast, overload

T = TypeVar("T")


# Two overloads because mypy solves ``Callable[[], bool]`` against ``T | bool | None``
# as T = Never, which would make every line after ``wait_for(lambda: flag, ...)``
# unreachable to the type checker.
@overload
def wait_for(
    predicate: Callable[[], bool], timeout: float, interval: float = ..., message: str = ...
) -> bool: ...
@overload
def wait_for(
    predicate: Callable[[], T | None], timeout: float, interval: float = ..., message: str = ...
) -> T: ...
def wait_for(
    predicate: Callable[[], T | bool | None],
    timeout: float,
    interval: float = 0.02,
    message: str = "",
) -> T:
    """Poll ``predicate`` until it returns something other than ``None`` or ``False``.

    Returns that value (``True`` for a boolean predicate; note that ``0`` and ``[]``
    count as done). Raises AssertionError naming ``message`` and the last value seen
    once ``timeout`` seconds have passed. This is the only way tests wait: a fixed
    sleep is either too short on a loaded CI machine or wastes time everywhere else.
    The predicate is always called at least once, and once more at the deadline.
    Exceptions from the predicate propagate at once.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value is not None and value is not False:
            return cast(T, value)
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AssertionError(
                f"timed out after {timeout}s waiting for {message or predicate!r} "
                f"(last value: {value!r})"
            )
        time.sleep(min(interval, remaining))


async def wait_for_async(
    predicate: Callable[[], bool], timeout: float, interval: float = 0.02, message: str = ""
) -> None:
    """``wait_for`` for a test that runs on an event loop: between polls it awaits
    ``asyncio.sleep``, so the tasks under test on the same loop keep running while the
    test waits (a blocking sleep would stop them, and the wait would time out)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AssertionError(f"timed out after {timeout}s waiting for {message or predicate!r}")
        await asyncio.sleep(min(interval, remaining))
