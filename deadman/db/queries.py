"""Load ``queries.sql`` into ``QUERIES``: query name -> SQL text.

The file is split on ``-- name: <query_name>`` lines. Values are typed as
``LiteralString`` so that mypy refuses SQL assembled from runtime strings anywhere
they flow (the same trick procrastinate uses).
"""

from __future__ import annotations

import re
from importlib import resources
from typing import LiteralString, cast

_NAME = re.compile(r"^-- name: ([a-z_][a-z0-9_]*)\s*$", re.MULTILINE)
_PARAM = re.compile(r"%\((\w+)\)s")


def parse(text: str) -> dict[str, LiteralString]:
    """Split a named-query file; duplicate or empty queries are a programming error."""
    parts = _NAME.split(text)
    queries: dict[str, LiteralString] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        sql = _sent(body.strip())
        if name in queries:
            raise ValueError(f"query {name!r} is defined twice")
        if not _strip_comments(sql):
            raise ValueError(f"query {name!r} is empty")
        queries[name] = cast(LiteralString, sql)  # type: ignore[redundant-cast]
    return queries


def _sent(sql: str) -> str:
    """What is sent: the query's first line (its leading comment names it in
    pg_stat_statements and in reports), then the SQL without its whole-line comments.
    psycopg parses a query once and caches it only up to 4,096 bytes
    (``MAX_CACHED_STATEMENT_LENGTH``); the refill and the look after a claim were
    longer with their comments, and were parsed again at every execute (16 against
    2 us: DECISIONS 71). The comments stay in the file, where they are read."""
    first, _, rest = sql.partition("\n")
    kept = [ln for ln in rest.splitlines() if not ln.lstrip().startswith("--")]
    return "\n".join([first, *kept]).strip()


def _strip_comments(sql: str) -> str:
    return "\n".join(ln for ln in sql.splitlines() if not ln.lstrip().startswith("--")).strip()


def numbered(sql: LiteralString) -> tuple[LiteralString, list[str]]:
    """``sql`` with ``$n`` parameters in place of ``%(name)s`` (for a server-side
    PREPARE, as the plan tests and bench.scale run it: EXPLAIN EXECUTE shows the
    generic plan a worker's session uses), and the parameter names in ``$n`` order."""
    order: list[str] = []

    def number(m: re.Match[str]) -> str:
        if m.group(1) not in order:
            order.append(m.group(1))
        return f"${order.index(m.group(1)) + 1}"

    return cast(LiteralString, _PARAM.sub(number, sql)), order  # type: ignore[redundant-cast]


def load() -> dict[str, LiteralString]:
    text = resources.files("deadman.db").joinpath("queries.sql").read_text(encoding="utf-8")
    return parse(text)


QUERIES: dict[str, LiteralString] = load()
