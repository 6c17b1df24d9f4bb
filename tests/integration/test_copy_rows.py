"""``deadman.db.copyrows``: a bulk enqueue's COPY reaches the server every 100 rows,
not every 32 KiB (DECISIONS 87), and the rows arrive as written. The sends are
watched through a psycopg ``Writer`` that records each piece it passes on; if this
psycopg stopped offering the early send, the pieces would grow to 32 KiB and the
first test would fail."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg.copy import AsyncLibpqWriter, LibpqWriter

from deadman.client import Client
from deadman.db import copyrows
from deadman.errors import InvalidJob
from tests.factories import connect

#: a row about as long as a bulk enqueue's job row (~70 bytes)
ROW = ("default", "bench.noop", '{"kind": "exponential", "base_ms": 1000}')


class Recording(LibpqWriter):
    def __init__(self, cursor: psycopg.Cursor[Any]) -> None:
        super().__init__(cursor)
        self.sizes: list[int] = []

    def write(self, data: Any) -> None:
        self.sizes.append(len(data))
        super().write(data)


class RecordingAsync(AsyncLibpqWriter):
    def __init__(self, cursor: psycopg.AsyncCursor[Any]) -> None:
        super().__init__(cursor)
        self.sizes: list[int] = []

    async def write(self, data: Any) -> None:
        self.sizes.append(len(data))
        await super().write(data)


def _sent_as_asked(sizes: list[int], rows: int) -> None:
    line = len(str(rows)) + 1 + len("\t".join(ROW)) + 1  # n, tab, the row, newline
    assert len(sizes) == -(-rows // copyrows.ROWS_PER_SEND), sizes
    assert max(sizes) <= copyrows.ROWS_PER_SEND * line, sizes


def _stored(conn: psycopg.Connection[Any], rows: int) -> None:
    got = conn.execute(
        "SELECT count(*) AS n, max(n) AS top FROM t WHERE a = %s AND b = %s AND c = %s::jsonb",
        ROW,
    )
    assert got.fetchone() == {"n": rows, "top": rows - 1}


@pytest.mark.parametrize("rows", [1, 99, 100, 1_000, 1_234])
def test_rows_go_every_hundred_rows(db_dsn: str, rows: int) -> None:
    with connect(db_dsn) as conn:
        conn.execute("CREATE TEMP TABLE t (n int, a text, b text, c jsonb)")
        with conn.cursor() as cur:
            writer = Recording(cur)
            with cur.copy("COPY t (n, a, b, c) FROM STDIN", writer=writer) as copy:
                copyrows.write_rows(copy, ((n, *ROW) for n in range(rows)))
        _sent_as_asked(writer.sizes, rows)
        _stored(conn, rows)


def test_rows_go_every_hundred_rows_async(db_dsn: str) -> None:
    async def run() -> list[int]:
        async with await psycopg.AsyncConnection.connect(db_dsn, autocommit=True) as conn:
            await conn.execute("CREATE TEMP TABLE t (n int, a text, b text, c jsonb)")
            cur = conn.cursor()
            writer = RecordingAsync(cur)
            async with cur.copy("COPY t (n, a, b, c) FROM STDIN", writer=writer) as copy:
                await copyrows.write_rows_async(copy, ((n, *ROW) for n in range(1_000)))
            got = await conn.execute("SELECT count(*), max(n) FROM t")
            assert await got.fetchone() == (1_000, 999)
        return writer.sizes

    _sent_as_asked(asyncio.run(run()), 1_000)


def test_a_binary_copy_is_written_without_early_sends(db_dsn: str) -> None:
    """A binary formatter's end() writes the trailer: never called early."""
    with connect(db_dsn) as conn:
        conn.execute("CREATE TEMP TABLE t (n int, a text, b text, c text)")
        cur = conn.cursor()
        with cur.copy("COPY t (n, a, b, c) FROM STDIN (FORMAT BINARY)") as copy:
            assert copyrows.early_send(copy) is None
            copy.set_types(["int4", "text", "text", "text"])
            copyrows.write_rows(copy, ((n, *ROW) for n in range(250)))
        got = conn.execute("SELECT count(*) AS n FROM t WHERE (a, b, c) = (%s, %s, %s)", ROW)
        assert got.fetchone() == {"n": 250}


@pytest.fixture
def client(db_dsn: str) -> Iterator[Client]:
    with Client(db_dsn) as c:
        yield c


def test_keys_with_copys_special_characters_are_stored_as_given(
    client: Client, db_dsn: str
) -> None:
    """The staged path COPYs the keys, spread over several sends: keys with
    backslashes (COPY's escape), an end-of-data marker and a NULL marker come back
    exactly, and find their jobs again."""
    keys = [f"{k}{i}" for i, k in enumerate(["back\\slash\\", "\\.", "\\N", "é\u2028"] * 60)]
    ids = client.enqueue_many([client.job("t", {"k": k}, idempotency_key=k) for k in keys])
    with connect(db_dsn) as conn:
        stored = conn.execute(
            "SELECT idempotency_key FROM deadman.jobs WHERE id = ANY(%s) ORDER BY id", (ids,)
        ).fetchall()
    assert [r["idempotency_key"] for r in stored] == keys
    assert [client.enqueue("t", {"k": k}, idempotency_key=k).id for k in keys[::50]] == ids[::50]


@pytest.mark.parametrize("keyed", [False, True], ids=["straight", "staged"])
def test_a_row_refused_after_the_first_sends_stores_nothing(
    client: Client, db_dsn: str, keyed: bool
) -> None:
    """Rows already sent when a later one is refused (Postgres refuses row 250's
    payload, a NUL, well after the first sends) are not kept: the COPY and its
    transaction roll back, and the client goes on."""
    jobs = [client.job("t") for _ in range(300)]
    if keyed:
        jobs[0] = client.job("t", idempotency_key="k")
    jobs[250] = client.job("t", {"s": "nul\x00"})
    with pytest.raises(InvalidJob):
        client.enqueue_many(jobs)
    with connect(db_dsn) as conn:
        assert conn.execute("SELECT count(*) AS n FROM deadman.jobs").fetchone() == {"n": 0}
    assert len(client.enqueue_many([client.job("t")])) == 1
