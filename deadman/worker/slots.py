"""How many handlers may run at once: the producer never claims more than free()."""

from __future__ import annotations

import asyncio


class Slots:
    """How many handlers may run at once; the producer never claims more than free()."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.used = 0
        self._freed = asyncio.Event()

    def free(self) -> int:
        return self.size - self.used

    def take(self) -> None:
        self.used += 1

    def give(self) -> None:
        self.used -= 1
        self._freed.set()

    async def wait_freed(self) -> None:
        self._freed.clear()
        if self.free() > 0:
            return
        await self._freed.wait()

    async def wait_given(self) -> None:
        """Until the next give(), whatever is free now."""
        self._freed.clear()
        await self._freed.wait()
