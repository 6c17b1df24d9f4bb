"""The named-query loader, and that every query the code asks for exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from deadman.db import queries
from deadman.db.queries import QUERIES, parse

PACKAGE = Path(queries.__file__).resolve().parents[1]


def test_parse_splits_on_names_and_keeps_the_first_line_and_trailing_comments() -> None:
    text = """-- a file header that belongs to no query

-- name: first
-- what it is for
-- and why, which stays in the file
SELECT 1  -- a trailing comment is kept
  -- an indented one is not
;

-- name: second_one
SELECT %(x)s
FROM t;
"""
    got = parse(text)
    assert list(got) == ["first", "second_one"]
    assert got["first"] == "-- what it is for\nSELECT 1  -- a trailing comment is kept\n;"
    assert got["second_one"] == "SELECT %(x)s\nFROM t;"


def test_every_query_fits_psycopg_s_parse_cache() -> None:
    """psycopg caches its parse of a query up to 4,096 bytes (MAX_CACHED_STATEMENT_LENGTH
    in psycopg._queries); a longer one is parsed again at every execute."""
    from psycopg import _queries

    assert _queries.MAX_CACHED_STATEMENT_LENGTH == 4096
    for name, sql in QUERIES.items():
        assert len(sql.encode()) <= _queries.MAX_CACHED_STATEMENT_LENGTH, name


def test_parse_of_a_file_without_names_is_empty() -> None:
    assert parse("-- just a comment\n") == {}


def test_duplicate_names_are_rejected() -> None:
    with pytest.raises(ValueError, match="'dup' is defined twice"):
        parse("-- name: dup\nSELECT 1;\n-- name: other\nSELECT 2;\n-- name: dup\nSELECT 3;\n")


@pytest.mark.parametrize(
    "body", ["", "\n\n", "-- only a comment\n", "   -- indented comment\n\n"], ids=repr
)
def test_empty_queries_are_rejected(body: str) -> None:
    with pytest.raises(ValueError, match="'empty' is empty"):
        parse(f"-- name: ok\nSELECT 1;\n-- name: empty\n{body}-- name: after\nSELECT 2;\n")


def test_the_shipped_file_loads() -> None:
    assert len(QUERIES) >= 20
    assert all(sql.strip() for sql in QUERIES.values())
    for name in QUERIES:
        assert re.fullmatch(r"[a-z_][a-z0-9_]*", name)


def _names_used(source: str) -> set[str]:
    used = set(re.findall(r"""QUERIES\[\s*["']([a-z0-9_]+)["']\s*\]""", source))
    used |= set(re.findall(r"""\._(?:all|tuples)\(\s*["']([a-z0-9_]+)["']""", source))
    return used


def test_every_query_the_store_uses_exists() -> None:
    source = "".join(p.read_text(encoding="utf-8") for p in (PACKAGE / "store").glob("*.py"))
    used = _names_used(source)
    # Guard against the regexes silently matching nothing after a refactor.
    assert {"job_insert", "job_claim", "job_finish_many", "job_rescue_expired"} <= used
    assert sorted(used - set(QUERIES)) == []


#: modules that load a query file of their own (``QUERIES = parse(...)``), beside it
OWN_QUERIES = {
    "shards/ids.py": PACKAGE / "shards" / "queries.sql",
    "chaos/hosts_scenario.py": PACKAGE / "chaos" / "hosts.sql",
    "chaos/verify.py": PACKAGE / "chaos" / "verify.sql",
}


def test_every_query_the_package_uses_exists() -> None:
    """Each name a module looks up is in the query file it loads: deadman/db/queries.sql,
    or its own (OWN_QUERIES)."""
    missing: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = str(path.relative_to(PACKAGE))
        known = parse(OWN_QUERIES[rel].read_text("utf-8")) if rel in OWN_QUERIES else QUERIES
        for name in sorted(_names_used(path.read_text(encoding="utf-8")) - set(known)):
            missing.setdefault(name, []).append(rel)
    assert missing == {}
    # the modules named above do load their own file (and nothing else does)
    own = {
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if re.search(r"^QUERIES: .* = parse\(", path.read_text("utf-8"), re.M)
    }
    assert own == set(OWN_QUERIES)


def test_values_are_parameters_never_python_formatting() -> None:
    # %(name)s placeholders only; a bare % must be doubled (format() in the rescue).
    for name, sql in QUERIES.items():
        stripped = re.sub(r"%\([a-z_]+\)s|%%", "", sql)
        assert "%" not in stripped, name


def test_every_query_is_used() -> None:
    """A named query nobody runs is dead SQL that still has to be kept true (and the
    race matrix would have to race it): the package (or, for a few checks, a test)
    names each one somewhere."""
    literals: set[str] = set()
    here = Path(__file__).resolve()
    for path in [*PACKAGE.rglob("*.py"), *here.parents[1].rglob("*.py")]:
        if path != here:
            literals |= set(re.findall(r"""["']([a-z][a-z0-9_]*)["']""", path.read_text("utf-8")))
    assert sorted(set(QUERIES) - literals) == []
