"""Which event loop a long-running process runs on (``DEADMAN_EVENT_LOOP``).

uvloop by default where it is installed (a dependency everywhere but Windows): the
worker starts an asyncio task per job and hands every round trip's readiness to the
loop, and uvloop does both in C (DECISIONS 74 has the measurement). ``asyncio``
keeps the standard library's loop, e.g. to debug with asyncio's own debug mode.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from deadman.errors import ConfigError

T = TypeVar("T")

CHOICES = ("auto", "uvloop", "asyncio")


def loop_factory(choice: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The factory of the loop ``choice`` names; None for the standard one. ``auto``:
    uvloop when importable. ``uvloop`` when it is not installed is a ConfigError."""
    if choice == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        if choice == "uvloop":
            raise ConfigError("DEADMAN_EVENT_LOOP is uvloop, but uvloop is not installed") from None
        return None
    return uvloop.new_event_loop


def run(main: Callable[[], Coroutine[Any, Any, T]], choice: str) -> T:
    """``asyncio.run(main())`` on the loop ``choice`` names."""
    with asyncio.Runner(loop_factory=loop_factory(choice)) as runner:
        return runner.run(main())
