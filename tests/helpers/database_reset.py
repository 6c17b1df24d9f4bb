"""A test database given back, made fresh again in place of a new copy.

``CREATE DATABASE ... TEMPLATE`` costs ~90 ms of the server's time on this suite's
2-core machines (8 MB of catalogs, written through WAL), and ~1,000 tests take one
(DECISIONS 98). Most of them write a few rows into two or three tables. Emptying those
tables costs a few milliseconds, so the pool (tests/helpers/database_pool.py) hands a
given-back database out again when it can prove the copy is as the template made it:

- **No DDL ran in it.** The template carries an event trigger (:func:`install_guard`)
  that records every DDL command that commits; a database with a record is dropped.
- **Nothing about the database itself changed**: connections allowed, no connection
  limit, no per-database settings, no prepared transactions, the template's owner.
- **Tables the template filled hold what they held** (compared by content hash).

Then the tables that were written are truncated (with the tables their foreign keys
tie them to), the sequences that moved are set back, the planner's statistics of user
relations are deleted (a fresh copy has none), every relation's page and tuple counts
are set back to the fresh copy's, and the database's counters reset. A database that
fails any check, or whose reset fails, is dropped as before.

Every session on the database is ended first, and the database is renamed before it
is reset: a process a test left behind, reconnecting with the old name, finds no
database, exactly as after a drop.
"""

from __future__ import annotations

from dataclasses import dataclass

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from tests.helpers import wait_for

GUARD_SCHEMA = "deadman_test_guard"

_GUARD = f"""
CREATE SCHEMA {GUARD_SCHEMA};
CREATE TABLE {GUARD_SCHEMA}.ddl (tag text NOT NULL);
CREATE FUNCTION {GUARD_SCHEMA}.note_ddl() RETURNS event_trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
BEGIN
    INSERT INTO {GUARD_SCHEMA}.ddl (tag) VALUES (tg_tag);
END
$$;
CREATE EVENT TRIGGER {GUARD_SCHEMA}_ddl ON ddl_command_end
    EXECUTE FUNCTION {GUARD_SCHEMA}.note_ddl();
"""

#: user tables: not the system's, not the guard's own
_TABLES = f"""
SELECT c.oid::regclass::text, pg_relation_size(c.oid), c.relpages, c.reltuples
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.relkind = 'r'
  AND n.nspname NOT IN ('pg_catalog', 'information_schema', '{GUARD_SCHEMA}')
  AND n.nspname NOT LIKE 'pg\\_%'
"""

_FOREIGN_KEYS = f"""
SELECT k.conrelid::regclass::text, k.confrelid::regclass::text
FROM pg_constraint k
JOIN pg_class c ON c.oid = k.conrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE k.contype = 'f' AND n.nspname <> '{GUARD_SCHEMA}'
"""

_SEQUENCES = f"""
SELECT format('%I.%I', schemaname, sequencename), start_value, last_value
FROM pg_sequences WHERE schemaname <> '{GUARD_SCHEMA}'
"""

#: the planner's counts of every relation made after initdb (tables, indexes, TOAST):
#: TRUNCATE leaves an index at 0 pages and -1 tuples where a fresh copy has 1 and 0
_RELSTATS = """
SELECT oid, relpages, reltuples, relallvisible FROM pg_class
WHERE oid >= 16384 AND relkind IN ('r', 'i', 't', 'm')
ORDER BY oid
"""

_RELSTATS_RESTORE = """
UPDATE pg_class c
SET relpages = b.pages, reltuples = b.tuples, relallvisible = b.allvisible
FROM unnest(%s::oid[], %s::integer[], %s::real[], %s::integer[])
    AS b(oid, pages, tuples, allvisible)
WHERE c.oid = b.oid
  AND (c.relpages, c.reltuples, c.relallvisible)
      IS DISTINCT FROM (b.pages, b.tuples, b.allvisible)
"""

#: the database itself as the template made it (its owner is the template's)
_DATABASE_UNCHANGED = """
SELECT d.datallowconn AND d.datconnlimit = -1
   AND d.datdba = (SELECT t.datdba FROM pg_database t WHERE t.datname = %(template)s)
   AND NOT EXISTS (SELECT 1 FROM pg_db_role_setting s WHERE s.setdatabase = d.oid)
   AND NOT EXISTS (SELECT 1 FROM pg_prepared_xacts x WHERE x.database = d.datname)
FROM pg_database d WHERE d.datname = %(name)s
"""

_END_SESSIONS = """
SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
WHERE datname = %s AND pid <> pg_backend_pid()
"""

_SESSIONS_LEFT = "SELECT count(*) FROM pg_stat_activity WHERE datname = %s"

Conn = psycopg.Connection[tuple[object, ...]]


def install_guard(conn: Conn) -> bool:
    """Install the DDL recorder into the template ``conn`` is connected to, after its
    migrations: every copy then records the DDL that commits in it. False where the
    role may not (an event trigger needs a superuser: a server that
    DEADMAN_TEST_DATABASE_URL names may not give us one); copies are then never
    reused, only dropped."""
    try:
        conn.execute(_GUARD.encode())  # one implicit transaction: all of it or nothing
    except psycopg.errors.InsufficientPrivilege:
        return False
    return True


def _content_hash(conn: Conn, table: str) -> str:
    row = conn.execute(
        sql.SQL(
            "SELECT md5(coalesce(string_agg(t::text, E'\\n' ORDER BY t::text), '')) FROM {} t"
        ).format(sql.SQL(table))
    ).fetchone()
    assert row is not None
    return str(row[0])


@dataclass(frozen=True)
class Baseline:
    """What a fresh copy of the template holds, read once from the first copy."""

    #: table -> (size, relpages, reltuples) of the tables the template left empty
    empty: dict[str, tuple[int, int, float]]
    #: table -> content hash of the tables the template filled
    filled: dict[str, str]
    #: table -> the tables its foreign keys tie it to, either way
    tied: dict[str, frozenset[str]]
    #: sequence -> (start value, last value; None: never read)
    sequences: dict[str, tuple[int, int | None]]
    #: _RELSTATS's columns, each as a list
    relstats: tuple[list[int], list[int], list[float], list[int]]
    #: the planner statistics a fresh copy has (none: the template is never analyzed)
    planner_stats: int

    @classmethod
    def read(cls, dsn: str) -> Baseline:
        """NotReusable when a reset could not work on this server: no guard in the
        copy, or a role that may not end sessions or write the catalogs it resets."""
        with psycopg.connect(dsn, autocommit=True) as conn:
            able = conn.execute(
                "SELECT (SELECT rolsuper FROM pg_roles WHERE rolname = current_user)"
                " AND to_regclass(%s) IS NOT NULL",
                (f"{GUARD_SCHEMA}.ddl",),
            ).fetchone()
            if able is None or able[0] is not True:
                raise NotReusable("no DDL guard in the template, or not a superuser")
            empty: dict[str, tuple[int, int, float]] = {}
            filled: dict[str, str] = {}
            for name, size, pages, tuples in conn.execute(_TABLES).fetchall():
                if size == 0:
                    empty[str(name)] = (int(str(size)), int(str(pages)), float(str(tuples)))
                else:
                    filled[str(name)] = _content_hash(conn, str(name))
            tied: dict[str, set[str]] = {}
            for child, parent in conn.execute(_FOREIGN_KEYS).fetchall():
                tied.setdefault(str(child), set()).add(str(parent))
                tied.setdefault(str(parent), set()).add(str(child))
            sequences = {
                str(name): (int(str(start)), None if last is None else int(str(last)))
                for name, start, last in conn.execute(_SEQUENCES).fetchall()
            }
            rows = conn.execute(_RELSTATS).fetchall()
            stats = conn.execute(
                "SELECT count(*) FROM pg_statistic WHERE starelid >= 16384"
            ).fetchone()
        relstats = (
            [int(str(r[0])) for r in rows],
            [int(str(r[1])) for r in rows],
            [float(str(r[2])) for r in rows],
            [int(str(r[3])) for r in rows],
        )
        return cls(
            empty,
            filled,
            {k: frozenset(v) for k, v in tied.items()},
            sequences,
            relstats,
            -1 if stats is None else int(str(stats[0])),
        )

    def to_truncate(self, written: set[str]) -> list[str]:
        """``written`` and every table a foreign key ties to one of them, transitively
        (TRUNCATE refuses a referenced table without its referrers)."""
        out = set(written)
        todo = list(written)
        while todo:
            for other in self.tied.get(todo.pop(), frozenset()):
                if other not in out:
                    out.add(other)
                    todo.append(other)
        return sorted(out)


class NotReusable(Exception):
    """The database changed in a way a reset does not undo: drop it instead."""


def end_sessions(admin: Conn, name: str, within: float = 5.0) -> None:
    """End every session on ``name`` and wait, with a deadline, until they are gone
    (pg_terminate_backend only signals them)."""
    admin.execute(_END_SESSIONS, (name,))

    def gone() -> bool:
        row = admin.execute(_SESSIONS_LEFT, (name,)).fetchone()
        return row is not None and row[0] == 0

    try:
        wait_for(gone, within, interval=0.005, message=f"the sessions on {name} to end")
    except AssertionError as exc:
        raise NotReusable(str(exc)) from exc


def reuse(
    admin: Conn, server_dsn: str, baseline: Baseline, template: str, name: str, new_name: str
) -> None:
    """Make ``name`` as fresh as a new copy of ``template``, under ``new_name``.

    Raises NotReusable (or a psycopg error) when it cannot; the database is then left
    for the caller to drop, under whichever of the two names it has."""
    end_sessions(admin, name)
    row = admin.execute(_DATABASE_UNCHANGED, {"template": template, "name": name}).fetchone()
    if row is None or row[0] is not True:
        raise NotReusable(f"{name}: the database itself was changed")
    admin.execute(
        sql.SQL("ALTER DATABASE {} RENAME TO {}").format(
            sql.Identifier(name), sql.Identifier(new_name)
        )
    )
    with psycopg.connect(make_conninfo(server_dsn, dbname=new_name), autocommit=True) as conn:
        _reset(conn, baseline)


def _reset(conn: Conn, baseline: Baseline) -> None:
    if baseline.planner_stats != 0:
        raise NotReusable("a fresh copy has planner statistics, which a reset cannot restore")
    guard = conn.execute(
        sql.SQL("SELECT count(*) FROM {}.ddl").format(sql.Identifier(GUARD_SCHEMA))
    ).fetchone()
    if guard is None or guard[0] != 0:
        raise NotReusable(f"DDL ran in it ({guard})")
    written: set[str] = set()
    seen: set[str] = set()
    for name, size, pages, tuples in conn.execute(_TABLES).fetchall():
        table = str(name)
        seen.add(table)
        if table in baseline.empty:
            state = (int(str(size)), int(str(pages)), float(str(tuples)))
            if state != baseline.empty[table]:
                written.add(table)
        elif table not in baseline.filled:
            raise NotReusable(f"a table the template does not have: {table}")
    if seen != set(baseline.empty) | set(baseline.filled):
        raise NotReusable("tables of the template are missing")
    with conn.transaction():
        for table, digest in baseline.filled.items():
            if _content_hash(conn, table) != digest:
                raise NotReusable(f"{table} no longer holds what the template put there")
        truncate = baseline.to_truncate(written)
        if set(truncate) & set(baseline.filled):
            raise NotReusable("a table the template filled is tied to one that was written")
        if truncate:
            conn.execute(
                sql.SQL("TRUNCATE {}").format(sql.SQL(", ").join(sql.SQL(t) for t in truncate))
            )
        # ANALYZE of a table also writes its expression indexes' statistics
        conn.execute("DELETE FROM pg_statistic WHERE starelid >= 16384")
        conn.execute(_RELSTATS_RESTORE, baseline.relstats)
        for name, _start, last in conn.execute(_SEQUENCES).fetchall():
            sequence = str(name)
            want = baseline.sequences.get(sequence)
            if want is None:
                raise NotReusable(f"a sequence the template does not have: {sequence}")
            if (None if last is None else int(str(last))) != want[1]:
                if want[1] is None:
                    conn.execute("SELECT setval(%s::regclass, %s, false)", (sequence, want[0]))
                else:
                    conn.execute("SELECT setval(%s::regclass, %s, true)", (sequence, want[1]))
    # This session's own counts (the hashes' scans) first, then every counter to zero.
    conn.execute("SELECT pg_stat_force_next_flush()")
    conn.execute("SELECT pg_stat_reset()")
