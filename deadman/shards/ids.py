"""How a job id names its shard: each shard's databases hand out ids from their own
range, ``index << 48`` up to the next index's start, so ``id >> 48`` is the shard.

Why this and not ids such as ``"a:123"``: an id stays a bigint everywhere it already
is (``Job.id``, ``depends_on``, ``GET /jobs/{id}``, the dashboard, the CLI, a worker's
logs), so nothing but the router needs to know about shards. The cost: a one-time
``deadman shards init`` per shard (:func:`set_range`; the router refuses a shard that
skipped it, :func:`check_range`), at most 32 shards (indexes 0-31, so every id stays
below 2**53 and survives a JavaScript number), 2**48 ids per shard, and ids that no
longer sort by creation across shards (a merged listing orders by ``created_at``).
Shard 0's range starts at 1: an existing single-primary database becomes shard 0
without renumbering a job.
"""

from __future__ import annotations

from importlib import resources
from typing import Any, LiteralString

import psycopg
from psycopg.errors import RaiseException
from psycopg.rows import dict_row

from deadman.db.queries import parse
from deadman.errors import ConfigError, translate

SHIFT = 48
#: the largest index: ids stay below 2**53, exact as a JavaScript number (the dashboard)
MAX_INDEX = 31
_SEQUENCES = ("jobs_id_seq", "workflows_id_seq")

QUERIES: dict[str, LiteralString] = parse(
    resources.files("deadman.shards").joinpath("queries.sql").read_text(encoding="utf-8")
)


def id_range(index: int) -> tuple[int, int]:
    """The first and last id shard ``index`` hands out (shard 0's ids start at 1)."""
    if not 0 <= index <= MAX_INDEX:
        raise ValueError(f"shard index {index} is not in 0..{MAX_INDEX}")
    return max(1, index << SHIFT), ((index + 1) << SHIFT) - 1


def shard_index_of(any_id: int) -> int:
    """The index of the shard that made a job or workflow id."""
    return any_id >> SHIFT


def set_range(conn: psycopg.Connection[Any], index: int) -> None:
    """Confine ``conn``'s database's id sequences to shard ``index``'s range, in one
    transaction (queries.sql, shard_set_range, says what happens to ids already made)."""
    first, last = id_range(index)
    try:
        with translate(), conn.transaction():
            conn.execute(QUERIES["shard_range_given"], {"first": first, "last": last})
            conn.execute(QUERIES["shard_set_range"])
    except RaiseException as exc:  # the statement's own refusal, nothing changed
        raise ConfigError(f"shard index {index}: {exc.diag.message_primary}") from exc


def check_range(conn: psycopg.Connection[Any], index: int, shard: str) -> None:
    """ConfigError unless ``conn``'s database hands out shard ``index``'s ids: a shard
    never initialised, or a URL pointing at another shard's database (two swapped
    entries of the map) would otherwise make ids that route to the wrong cluster."""
    with translate(), conn.cursor(row_factory=dict_row) as cur:
        verify_range(cur.execute(QUERIES["shard_id_ranges"]).fetchall(), index, shard)


async def acheck_range(conn: psycopg.AsyncConnection[Any], index: int, shard: str) -> None:
    """:func:`check_range` on an async connection."""
    with translate():
        async with conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(QUERIES["shard_id_ranges"])
            verify_range(await cur.fetchall(), index, shard)


def verify_range(found: list[dict[str, Any]], index: int, shard: str) -> None:
    """What :func:`check_range` checks, on the rows of ``shard_id_ranges``."""
    first, last = id_range(index)
    rows = {r["name"]: r for r in found}
    for name in _SEQUENCES:
        row = rows.get(name)
        if row is None:
            raise ConfigError(f"shard {shard}: no sequence deadman.{name}; is it migrated?")
        if (row["min_value"], row["max_value"]) != (first, last):
            raise ConfigError(
                f"shard {shard}: deadman.{name} hands out ids {row['min_value']}.."
                f"{row['max_value']}, not shard index {index}'s {first}..{last}; "
                "run `deadman shards init` (or fix the map if its url points at another "
                "shard's database)"
            )


def initialise(url: str, index: int, *, check_only: bool = False, shard: str = "") -> None:
    """Connect to ``url`` and :func:`set_range` it for shard ``index`` (or only
    :func:`check_range`); connection errors as DatabaseUnavailable."""
    with translate(), psycopg.connect(url, connect_timeout=10) as conn:
        if not check_only:
            set_range(conn, index)
        check_range(conn, index, shard or f"index {index}")
