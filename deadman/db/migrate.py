"""Apply ``migrations/NNNN_name.sql`` in order: each in its own transaction, all under
an advisory lock, recorded in ``deadman.schema_migrations``.

Re-running is a no-op. A database that has a migration this code does not know
(it is newer than the code) is refused: running old workers against a newer schema
is how a fleet quietly loses jobs. So is one whose applied migration is not the file
this code has (its SHA-256 is recorded when it is applied): a migration edited after
it ran leaves the database without what the code expects (a function the claim
calls, say), and the workers would fail every claim instead of refusing to start.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from importlib import resources
from importlib.abc import Traversable
from pathlib import Path

import psycopg
from psycopg.rows import TupleRow

from deadman.db.pool import prepare_threshold
from deadman.db.queries import QUERIES
from deadman.errors import DatabaseUnavailable, SchemaMismatch

_FILE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


def _migrations_dir() -> Traversable:
    """Inside the wheel they live at ``deadman/migrations``; in a checkout, at the top."""
    packaged = resources.files("deadman").joinpath("migrations")
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parents[2] / "migrations"


def available() -> list[Migration]:
    found: list[Migration] = []
    for entry in _migrations_dir().iterdir():
        m = _FILE.match(entry.name)
        if m:
            found.append(Migration(int(m.group(1)), m.group(2), entry.read_text("utf-8")))
    found.sort(key=lambda mig: mig.version)
    versions = [mig.version for mig in found]
    if len(set(versions)) != len(versions):
        raise SchemaMismatch(f"two migrations share a version number: {versions}")
    return found


def latest_version() -> int:
    migs = available()
    return migs[-1].version if migs else 0


def migrate(dsn: str, *, prepare: bool | None = None) -> list[int]:
    """Bring the database up to date. Returns the versions applied by this call.

    Safe through PgBouncer in transaction mode: every step is one transaction (the
    lock is transaction-level, taken again in each), nothing is set for the session,
    and ``prepare`` (None: DEADMAN_PREPARE) off keeps the lock statement, run once
    per migration, from being prepared on a server connection the next transaction
    may not get."""
    migrations = available()
    known = {m.version: m for m in migrations}
    applied_now: list[int] = []
    with _connect(dsn, prepare) as conn:
        with conn.transaction():
            conn.execute(QUERIES["migrations_lock"])
            conn.execute(QUERIES["migrations_prepare"])
            for v in _applied(conn, known):  # applied before checksums: record the file
                conn.execute(
                    QUERIES["migrations_checksum_backfill"],
                    {"version": v, "checksum": known[v].checksum},
                )
        # Each migration in its own transaction, each re-taking the lock and
        # re-reading what is applied, so concurrent migrators apply each file once.
        for mig in migrations:
            with conn.transaction():
                conn.execute(QUERIES["migrations_lock"])
                if mig.version in _applied(conn, known):
                    continue
                conn.execute(mig.sql.encode())
                conn.execute(
                    QUERIES["migrations_record"],
                    {"version": mig.version, "name": mig.name, "checksum": mig.checksum},
                )
                applied_now.append(mig.version)
        if not migrations:
            return applied_now
        with conn.transaction():
            _applied(conn, known)  # a newer migrator may have run meanwhile
    return applied_now


def _applied(conn: psycopg.Connection[TupleRow], known: dict[int, Migration]) -> set[int]:
    """The versions the database has applied; SchemaMismatch if one of them is not
    known to this code (the database is newer than the code), or was applied from
    another file than this code's (its recorded checksum differs)."""
    rows = conn.execute(QUERIES["migrations_applied"]).fetchall()
    done = {int(str(r[0])) for r in rows}
    unknown = sorted(done - set(known))
    if unknown:
        raise SchemaMismatch(
            f"the database has migrations {unknown} that this version of "
            f"Deadman does not know (it knows up to {max(known, default=0)}); "
            "upgrade Deadman instead of running old code against a newer schema"
        )
    changed = [
        f"{int(str(version)):04d}_{name}"
        for version, name, checksum in rows
        if checksum is not None and checksum != known[int(str(version))].checksum
    ]
    if changed:
        raise SchemaMismatch(
            f"migrations {changed} were applied to this database from other files than "
            "this version of Deadman has (their SHA-256 differs): a migration was edited "
            "after it ran; restore the file, or rebuild the database"
        )
    return done


def _connect(dsn: str, prepare: bool | None = None) -> psycopg.Connection[TupleRow]:
    """A connection that could not be made is DatabaseUnavailable, not a traceback;
    errors of the migrations themselves stay psycopg's, naming the statement."""
    try:
        return psycopg.connect(dsn, autocommit=True, prepare_threshold=prepare_threshold(prepare))
    except psycopg.OperationalError as exc:
        raise DatabaseUnavailable(" ".join(str(exc).split())) from exc


def current_version(conn: psycopg.Connection[tuple[object, ...]]) -> int | None:
    """The highest applied migration, or None on a database never migrated."""
    present = conn.execute(QUERIES["schema_migrations_exists"]).fetchone()
    if not present or not present[0]:
        return None
    row = conn.execute(QUERIES["schema_version_get"]).fetchone()
    return None if row is None or row[0] is None else int(str(row[0]))


def check_current(dsn: str) -> None:
    """Raise :class:`SchemaMismatch` unless the database is exactly at our version."""
    migrations = available()
    want = migrations[-1].version if migrations else 0
    with _connect(dsn) as conn:
        have = current_version(conn)
        if have is not None and have <= want:
            _applied(conn, {m.version: m for m in migrations})  # an edited migration
    if have is None:
        raise SchemaMismatch("the database has no Deadman schema; run `deadman migrate`")
    if have < want:
        raise SchemaMismatch(
            f"the database schema is at version {have}, this code needs {want}; "
            "run `deadman migrate`"
        )
    if have > want:
        raise SchemaMismatch(
            f"the database schema is at version {have}, newer than this code ({want}); "
            "upgrade Deadman"
        )
