"""The least-privilege role ``deadman_api`` (migrations/0002_api.sql): the whole API
works as it, and it cannot drop, alter, delete or mint fencing tokens."""

from __future__ import annotations

import psycopg
import pytest
from psycopg import errors as pgerr
from psycopg.conninfo import make_conninfo

from deadman.db.migrate import available, migrate
from tests.factories import insert_job
from tests.helpers.api import api_client, new_job

ROLE_OPTIONS = "-c role=deadman_api"


def test_the_api_works_as_deadman_api(db_dsn: str) -> None:
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        running = insert_job(conn, state="running")
        dead = insert_job(conn, state="dead")
        conn.execute(
            "INSERT INTO deadman.workers (id, hostname, pid, queues, concurrency)"
            " VALUES ('w', 'h', 1, '{default}', 1)"
        )
    as_role = make_conninfo(db_dsn, options=ROLE_OPTIONS)
    with api_client(as_role) as c:
        assert c.get("/ready").status_code == 200
        r = c.post("/jobs", json=new_job(), headers={"Idempotency-Key": "k"})
        assert r.status_code == 201
        assert c.post("/jobs", json=new_job(), headers={"Idempotency-Key": "k"}).status_code == 200
        jobs = [new_job(idempotency_key="b1"), new_job()]
        assert c.post("/jobs/batch", json={"jobs": jobs}).status_code == 201
        assert c.post("/jobs/batch", json={"jobs": jobs[:1]}).status_code == 200
        job_id = r.json()["id"]
        assert c.get(f"/jobs/{job_id}").status_code == 200
        assert c.get(f"/jobs/{job_id}/attempts").status_code == 200
        assert c.get("/jobs", params={"state": "queued", "queue": "default"}).status_code == 200
        assert c.post(f"/jobs/{job_id}/cancel").status_code == 200
        assert c.post(f"/jobs/{running.id}/cancel").status_code == 202
        assert c.post(f"/jobs/{dead.id}/retry").status_code == 200
        assert c.post("/queues/default/pause").status_code == 200
        assert c.post("/queues/default/resume").status_code == 200
        for path in ("/queues", "/workers", "/stats", "/metrics"):
            assert c.get(path).status_code == 200, path
        assert "deadman_api_database_up 1.0" in c.get("/metrics").text
    with psycopg.connect(db_dsn) as conn:
        row = conn.execute("SELECT current_user").fetchone()
        assert row is not None and row[0] != "deadman_api"  # the test's own session


FORBIDDEN = [
    "DROP TABLE deadman.jobs",
    "ALTER TABLE deadman.jobs ADD COLUMN evil integer",
    "DELETE FROM deadman.jobs",
    "TRUNCATE deadman.jobs",
    "CREATE TABLE deadman.evil (x integer)",
    "CREATE INDEX evil ON deadman.jobs (payload)",
    "DROP SCHEMA deadman CASCADE",
    "SELECT nextval('deadman.lease_token_seq')",
    "DELETE FROM deadman.schema_migrations",
    "INSERT INTO deadman.schema_migrations (version, name) VALUES (999, 'x')",
    "UPDATE deadman.workers SET pid = 0",
    "DELETE FROM deadman.attempt_log",
]


def test_deadman_api_cannot_drop_alter_or_delete(db_dsn: str) -> None:
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        insert_job(conn, state="queued")
        conn.execute("SET ROLE deadman_api")
        for statement in FORBIDDEN:
            with pytest.raises(pgerr.InsufficientPrivilege):
                conn.execute(statement)
        # it cannot grant itself more either (a no-op with a warning, not an error)
        conn.execute("GRANT DELETE ON deadman.jobs TO deadman_api")
        with pytest.raises(pgerr.InsufficientPrivilege):
            conn.execute("DELETE FROM deadman.jobs")
        conn.execute("RESET ROLE")
        row = conn.execute("SELECT count(*) FROM deadman.jobs").fetchone()
        assert row is not None and row[0] == 1


def test_migrations_rerun_where_the_role_already_exists(empty_db_dsn: str) -> None:
    # The role is cluster-wide and exists already (the template database made it).
    assert migrate(empty_db_dsn)
    (api,) = [m for m in available() if m.name == "api"]
    with psycopg.connect(empty_db_dsn, autocommit=True) as conn:
        conn.execute(api.sql.encode())  # the file itself is idempotent too
        row = conn.execute(
            "SELECT rolcanlogin, rolsuper FROM pg_roles WHERE rolname = 'deadman_api'"
        ).fetchone()
        assert row == (False, False)
        grants = conn.execute(
            "SELECT privilege_type FROM information_schema.role_table_grants"
            " WHERE grantee = 'deadman_api' AND table_name = 'jobs' ORDER BY 1"
        ).fetchall()
        assert [g[0] for g in grants] == ["INSERT", "SELECT", "UPDATE"]
