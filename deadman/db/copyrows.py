"""Rows for a COPY FROM STDIN, handed to the server every 100 rows rather than every
32 KiB (DECISIONS 87).

psycopg's ``Copy.write_row`` formats each row (in C) into a buffer that it sends only
once the buffer passes 32 KiB. A bulk enqueue of 1,000 jobs is ~70 KB of rows, so the
server got it in two or three pieces: it started inserting only after the client had
formatted half the batch, and the last piece's inserts and index entries waited for
the client's last row. Sent every 100 rows (~7 KB), the server inserts while the
client formats the rest.

psycopg has no public call that sends its buffer early. Its text formatter's
``end()`` hands the buffer over and empties it (``Copy`` calls it when the block
ends); written with ``Copy.write``, that buffer goes to the server as it is. Where a
psycopg has no such formatter (or the COPY is binary, whose ``end()`` writes the
trailer), rows are written as before: sent later, never differently.
tests/integration/test_copy_rows.py pins which one this psycopg does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import psycopg
from psycopg.pq import Format

#: rows between two sends (~7 KB for a bulk enqueue's job rows; DECISIONS 87)
ROWS_PER_SEND = 100


def write_rows(copy: psycopg.Copy, rows: Iterable[Sequence[Any]]) -> None:
    """``copy.write_row`` for each row, sending what is formatted every
    ROWS_PER_SEND rows."""
    early = early_send(copy)
    for n, row in enumerate(rows, 1):
        copy.write_row(row)
        if early is not None and n % ROWS_PER_SEND == 0:
            copy.write(early())


async def write_rows_async(copy: psycopg.AsyncCopy, rows: Iterable[Sequence[Any]]) -> None:
    """:func:`write_rows` on an async connection."""
    early = early_send(copy)
    for n, row in enumerate(rows, 1):
        await copy.write_row(row)
        if early is not None and n % ROWS_PER_SEND == 0:
            await copy.write(early())


def early_send(copy: psycopg.Copy | psycopg.AsyncCopy) -> Callable[[], Any] | None:
    """What hands over (and empties) the rows formatted so far, or None where this
    psycopg offers no way to (module docstring)."""
    formatter = getattr(copy, "formatter", None)
    if getattr(formatter, "format", None) != Format.TEXT:
        return None
    end = getattr(formatter, "end", None)
    return end if callable(end) else None
