"""deadman.api.protocol.Corked: a response's head and body, written in one step of the
event loop, leave as one write; a head alone leaves at the loop's next turn; close
sends what it holds first; abort drops it."""

from __future__ import annotations

import asyncio
from typing import Any

from deadman.api.protocol import Corked


class Recording(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: Any) -> None:
        assert not self.closed, "a write after close"
        self.writes.append(bytes(data))

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_write_buffer_size(self) -> int:
        return 0


def _corked() -> tuple[Corked, Recording]:
    inner = Recording()
    return Corked(inner, asyncio.get_running_loop()), inner


async def _turn() -> None:
    await asyncio.sleep(0)


def test_head_and_body_in_one_step_are_one_write() -> None:
    async def main() -> None:
        corked, inner = _corked()
        for i in range(3):  # three keep-alive responses
            corked.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n")
            corked.write(b"%02d" % i)
            await _turn()
        assert inner.writes == [
            b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n%02d" % i for i in range(3)
        ]

    asyncio.run(main())


def test_a_head_alone_leaves_at_the_next_turn_and_later_chunks_follow_in_order() -> None:
    async def main() -> None:
        corked, inner = _corked()
        corked.write(b"head")
        assert inner.writes == []
        assert corked.get_write_buffer_size() == 4
        await _turn()
        assert inner.writes == [b"head"]
        corked.write(b"chunk1")
        corked.write(b"chunk2")
        corked.write(b"chunk3")
        await _turn()
        assert b"".join(inner.writes) == b"headchunk1chunk2chunk3"

    asyncio.run(main())


def test_close_sends_what_it_holds_and_abort_drops_it() -> None:
    async def main() -> None:
        corked, inner = _corked()
        corked.write(b"last words")
        corked.close()
        assert inner.writes == [b"last words"] and inner.closed
        await _turn()  # the scheduled flush finds nothing to send (and no write after close)
        assert inner.writes == [b"last words"]

        corked, inner = _corked()
        corked.write(b"never sent")
        corked.abort()
        await _turn()
        assert inner.writes == [] and inner.closed

    asyncio.run(main())
