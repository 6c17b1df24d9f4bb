"""Migrations: apply once, refuse a newer schema, survive concurrent runs; and the
constraints that hold the invariants the code relies on."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from psycopg import errors as pgerr

from deadman.db import migrate as migrate_mod
from deadman.db.migrate import Migration, available, check_current, latest_version, migrate
from deadman.errors import SchemaMismatch
from tests.factories import ALL_STATES, connect, insert_job


def _versions(dsn: str) -> list[tuple[int, str]]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT version, name FROM deadman.schema_migrations ORDER BY version"
        ).fetchall()
    return [(int(v), str(n)) for v, n in rows]


def test_available_migrations_are_numbered_in_order() -> None:
    migs = available()
    assert migs, "no migrations found"
    assert migs[0] == Migration(1, "core", migs[0].sql)
    assert [m.version for m in migs] == sorted({m.version for m in migs})
    assert latest_version() == migs[-1].version


def test_migrate_applies_everything_to_an_empty_database(empty_db_dsn: str) -> None:
    expected = [m.version for m in available()]
    assert migrate(empty_db_dsn) == expected
    assert _versions(empty_db_dsn) == [(m.version, m.name) for m in available()]
    with psycopg.connect(empty_db_dsn) as conn:
        tables = {
            r[0]
            for r in conn.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = 'deadman'"
            )
        }
    assert {"jobs", "attempts", "queues", "workers", "effects", "schema_migrations"} <= tables


def test_second_run_is_a_no_op(empty_db_dsn: str) -> None:
    migrate(empty_db_dsn)
    before = _versions(empty_db_dsn)
    assert migrate(empty_db_dsn) == []
    assert _versions(empty_db_dsn) == before


def test_check_current_before_migrate_says_run_migrate(empty_db_dsn: str) -> None:
    with pytest.raises(SchemaMismatch, match="no Deadman schema"):
        check_current(empty_db_dsn)


def test_check_current_before_migrate_raises(empty_db_dsn: str) -> None:
    # An unmigrated database is refused.
    with pytest.raises((SchemaMismatch, psycopg.errors.UndefinedTable)):
        check_current(empty_db_dsn)


def test_check_current_with_an_empty_bookkeeping_table(empty_db_dsn: str) -> None:
    with psycopg.connect(empty_db_dsn, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA deadman")
        conn.execute(
            "CREATE TABLE deadman.schema_migrations (version integer PRIMARY KEY,"
            " name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"
        )
    with pytest.raises(SchemaMismatch, match="no Deadman schema"):
        check_current(empty_db_dsn)


def test_check_current_passes_after_migrate(empty_db_dsn: str) -> None:
    migrate(empty_db_dsn)
    check_current(empty_db_dsn)


def test_a_newer_schema_is_refused(db_dsn: str) -> None:
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO deadman.schema_migrations (version, name) VALUES (9999, 'future')"
        )
    known = latest_version()
    with pytest.raises(SchemaMismatch) as excinfo:
        migrate(db_dsn)
    message = str(excinfo.value)
    assert "[9999]" in message
    assert f"up to {known}" in message
    with pytest.raises(SchemaMismatch) as excinfo:
        check_current(db_dsn)
    assert "9999" in str(excinfo.value)
    assert f"({known})" in str(excinfo.value)


def test_each_applied_migration_records_its_files_checksum(db_dsn: str) -> None:
    with psycopg.connect(db_dsn) as conn:
        rows = conn.execute(
            "SELECT version, checksum FROM deadman.schema_migrations ORDER BY version"
        ).fetchall()
    assert rows == [(m.version, m.checksum) for m in available()]
    assert all(len(str(c)) == 64 for _, c in rows)


def test_a_migration_edited_after_it_ran_is_refused(db_dsn: str) -> None:
    """What an edited file looks like to the database: another checksum recorded."""
    victim = available()[-1]
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute(
            "UPDATE deadman.schema_migrations SET checksum = %s WHERE version = %s",
            ("0" * 64, victim.version),
        )
    label = f"{victim.version:04d}_{victim.name}"
    with pytest.raises(SchemaMismatch, match=f"{label}.*were applied .* from other files"):
        migrate(db_dsn)
    with pytest.raises(SchemaMismatch, match=f"{label}.*a migration was edited after it ran"):
        check_current(db_dsn)  # a worker or API server refuses to start on it


def test_a_migration_applied_before_checksums_is_trusted_once(db_dsn: str) -> None:
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("UPDATE deadman.schema_migrations SET checksum = NULL")
    check_current(db_dsn)  # nothing recorded: nothing to compare
    assert migrate(db_dsn) == []
    with psycopg.connect(db_dsn) as conn:
        missing = conn.execute(
            "SELECT count(*) FROM deadman.schema_migrations WHERE checksum IS NULL"
        ).fetchone()
    assert missing == (0,)
    check_current(db_dsn)


def _with_extra(
    monkeypatch: pytest.MonkeyPatch, *extra: Migration
) -> Callable[[], list[Migration]]:
    real = available()

    def fake() -> list[Migration]:
        return [*real, *extra]

    monkeypatch.setattr(migrate_mod, "available", fake)
    return fake


def test_an_older_schema_is_reported_and_upgraded(
    db_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    nxt = latest_version() + 1
    _with_extra(
        monkeypatch, Migration(nxt, "add_note", "ALTER TABLE deadman.jobs ADD COLUMN note text;")
    )
    with pytest.raises(SchemaMismatch, match=f"at version {nxt - 1}, this code needs {nxt}"):
        check_current(db_dsn)
    assert migrate(db_dsn) == [nxt]  # only the new one
    check_current(db_dsn)
    with psycopg.connect(db_dsn) as conn:
        conn.execute("SELECT note FROM deadman.jobs")


def test_a_failing_migration_leaves_nothing_behind(
    db_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    nxt = latest_version() + 1
    _with_extra(
        monkeypatch,
        Migration(nxt, "broken", "CREATE TABLE deadman.half_done (x int); SELECT 1/0;"),
    )
    with pytest.raises(psycopg.errors.DivisionByZero):
        migrate(db_dsn)
    assert [v for v, _ in _versions(db_dsn)] == [m.version for m in available()]
    with psycopg.connect(db_dsn) as conn:
        assert conn.execute("SELECT to_regclass('deadman.half_done')").fetchone() == (None,)


def test_concurrent_migrations_apply_each_file_once(empty_db_dsn: str) -> None:
    n = 4
    barrier = threading.Barrier(n)
    results: list[list[int]] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def run() -> None:
        try:
            barrier.wait(timeout=10)
            applied = migrate(empty_db_dsn)
            with lock:
                results.append(applied)
        except BaseException as exc:
            with lock:
                errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    assert errors == []
    assert len(results) == n
    applied = sorted(v for r in results for v in r)
    assert applied == [m.version for m in available()]  # each exactly once, in total
    assert [v for v, _ in _versions(empty_db_dsn)] == applied
    check_current(empty_db_dsn)


# ------------------------------------------------------------------------ constraints


def _violates(dsn: str, sql: str, params: dict[str, Any], error: type[Exception]) -> str:
    with psycopg.connect(dsn, autocommit=True) as conn, pytest.raises(error) as excinfo:
        conn.execute(sql, params)
    diag = getattr(excinfo.value, "diag", None)
    return str(getattr(diag, "constraint_name", "") or "")


def test_running_without_a_lease_token_is_refused(db_dsn: str) -> None:
    name = _violates(
        db_dsn,
        "INSERT INTO deadman.jobs (type, state, attempt, lease_expires_at, started_at)"
        " VALUES ('t', 'running', 1, now() + interval '10 s', now())",
        {},
        pgerr.CheckViolation,
    )
    assert name == "jobs_lease_iff_running"


def test_a_lease_token_outside_running_is_refused(db_dsn: str) -> None:
    name = _violates(
        db_dsn,
        "INSERT INTO deadman.jobs (type, state, lease_token) VALUES ('t', 'queued', 5)",
        {},
        pgerr.CheckViolation,
    )
    assert name == "jobs_lease_iff_running"


def test_an_unknown_state_is_refused(db_dsn: str) -> None:
    name = _violates(
        db_dsn,
        "INSERT INTO deadman.jobs (type, state) VALUES ('t', 'bogus')",
        {},
        pgerr.CheckViolation,
    )
    assert name == "jobs_state_valid"


def test_priority_out_of_range_is_refused(db_dsn: str) -> None:
    for priority in (101, -101):
        name = _violates(
            db_dsn,
            "INSERT INTO deadman.jobs (type, priority) VALUES ('t', %(p)s)",
            {"p": priority},
            pgerr.CheckViolation,
        )
        assert name == "jobs_priority_range"
    with connect(db_dsn) as conn:  # the limits themselves are fine
        insert_job(conn, priority=100)
        insert_job(conn, priority=-100)


def test_a_duplicate_idempotency_key_is_refused(db_dsn: str) -> None:
    with connect(db_dsn) as conn:
        insert_job(conn, idempotency_key="k-1")
        insert_job(conn, idempotency_key="k-2")  # a different key is fine
    name = _violates(
        db_dsn,
        "INSERT INTO deadman.jobs (type, idempotency_key) VALUES ('t', 'k-1')",
        {},
        pgerr.UniqueViolation,
    )
    assert name == "jobs_idempotency_key_uq"


def test_a_terminal_job_needs_finished_at(db_dsn: str) -> None:
    name = _violates(
        db_dsn,
        "INSERT INTO deadman.jobs (type, state, attempt) VALUES ('t', 'succeeded', 1)",
        {},
        pgerr.CheckViolation,
    )
    assert name == "jobs_finished_iff_terminal"


def test_the_factory_can_write_every_state(db_dsn: str) -> None:
    with connect(db_dsn) as conn:
        for state in ALL_STATES:
            insert_job(conn, state=state)
        rows = conn.execute("SELECT state FROM deadman.jobs ORDER BY id").fetchall()
    assert [r["state"] for r in rows] == list(ALL_STATES)
