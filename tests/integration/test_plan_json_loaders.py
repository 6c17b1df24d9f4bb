"""A plan's cursor reads JSON with deadman.db.jsoncodec's loaders on any connection:
a caller's (which may load jsonb otherwise, as Django's does) gets them set on the
cursor; Deadman's own connections already have them, and nothing is registered again
(every plan did, with psycopg's default loaders, which also skipped orjson)."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from psycopg.adapt import AdaptersMap
from psycopg.pq import Format

from deadman import Client
from deadman.db import jsoncodec
from deadman.db.pool import sync_pool
from deadman.store.plan import _json_loaders

JSONB = jsoncodec.CONTEXT.types["jsonb"].oid
OURS = jsoncodec.CONTEXT.get_loader(JSONB, Format.TEXT)


def test_a_callers_connection_gets_the_exact_loaders(db_dsn: str) -> None:
    with psycopg.connect(db_dsn) as conn:
        conn.adapters.register_loader("jsonb", psycopg.types.string.TextLoader)
        cur = conn.cursor()
        _json_loaders(cur)
        assert cur.adapters.get_loader(JSONB, Format.TEXT) is OURS
        assert conn.adapters.get_loader(JSONB, Format.TEXT) is not OURS  # theirs untouched
        value = cur.execute("SELECT '{\"n\": 18446744073709551616}'::jsonb").fetchone()
        assert value == ({"n": 2**64},)


def test_deadmans_own_connections_register_nothing(
    db_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    registered: list[object] = []
    original = AdaptersMap.register_loader

    def counted(self: AdaptersMap, *args: Any) -> None:
        registered.append(args)
        original(self, *args)

    pool = sync_pool(db_dsn, name="t", min_size=1, max_size=1)
    pool.open(wait=True)
    try:
        with pool.connection() as conn:
            cur = conn.cursor()
            monkeypatch.setattr(AdaptersMap, "register_loader", counted)
            _json_loaders(cur)
            assert registered == []
            assert cur.adapters.get_loader(JSONB, Format.TEXT) is OURS
    finally:
        pool.close()


def test_enqueue_keeps_a_number_past_64_bits(db_dsn: str) -> None:
    with Client(db_dsn) as client:
        job = client.enqueue("noop", {"n": 2**64, "m": -(2**63) - 1})
        assert job.payload == {"n": 2**64, "m": -(2**63) - 1}
        assert client.get(job.id).payload == job.payload  # type: ignore[union-attr]
