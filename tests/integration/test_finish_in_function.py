"""deadman.job_finish_in (migration 0025, DECISIONS 113) is ctx.transaction()'s fenced
completion: job_finish_many in a PL/pgSQL function, so that its plan is made once per
session under the worker's plan settings instead of afresh on every call on the
handler's connection. The race matrix's rows for job_finish_many describe it only
while the two say the same thing, word for word; and its settings must be the
worker's own (deadman/db/plans.py) and end with it, leaving the handler's session as
it was."""

from __future__ import annotations

import re

import psycopg

from deadman.db.plans import GENERIC
from deadman.db.queries import QUERIES
from deadman.model import AttemptOutcome, JobState
from deadman.store import Finish, SyncStore
from tests.factories import connect, insert_job

#: job_finish_many's parameters, as the function names them
PARAMS = {"%(batch)s": "p_batch", "%(ids)s": "p_ids", "%(idle_ms)s": "p_idle_ms"}


def _words(sql: str) -> str:
    """The SQL's words: comments dropped (QUERIES has none), whitespace collapsed."""
    return " ".join(re.sub(r"--[^\n]*", "", sql).split())


def _function(db_dsn: str) -> tuple[str, list[str]]:
    """deadman.job_finish_in's body and its SET clauses, as the database has them."""
    with psycopg.connect(db_dsn) as conn:
        row = conn.execute(
            "SELECT prosrc, proconfig FROM pg_proc WHERE oid = 'deadman.job_finish_in'::regproc"
        ).fetchone()
    assert row is not None
    return str(row[0]), list(row[1])


def test_the_function_runs_job_finish_many_word_for_word(db_dsn: str) -> None:
    statement = QUERIES["job_finish_many"]
    statement = statement[statement.index("WITH locked AS (") :].rstrip().rstrip(";")
    for param, name in PARAMS.items():
        statement = statement.replace(param, name)
    assert "%(" not in statement, "a parameter of job_finish_many the function lacks"
    body, _ = _function(db_dsn)
    assert _words(f"RETURN QUERY {statement};") in _words(body), (
        "deadman.job_finish_in no longer says what job_finish_many says: redefine it in"
        " a new migration (CREATE OR REPLACE FUNCTION) with the statement as it is now"
    )


def test_its_plan_settings_are_the_workers_own(db_dsn: str) -> None:
    wanted = dict(re.findall(r"-c (\w+)=(\w+)", GENERIC))
    _, config = _function(db_dsn)
    assert dict(s.split("=", 1) for s in config) == wanted


def test_the_handlers_session_keeps_its_settings_and_the_idle_limit_is_armed(
    db_dsn: str,
) -> None:
    with connect(db_dsn) as conn:
        inserted = insert_job(conn, state="running")
    job, token = inserted.id, inserted.lease_token
    assert token is not None
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        before = conn.execute(
            "SELECT current_setting('plan_cache_mode'), current_setting('enable_seqscan'),"
            " current_setting('jit')"
        ).fetchone()
        with conn.transaction():
            finish = Finish(job, token, JobState.SUCCEEDED, AttemptOutcome.SUCCEEDED)
            assert SyncStore().job_finish_in(conn, [finish], idle_ms=12_345) == {job}
            inside = conn.execute(
                "SELECT current_setting('plan_cache_mode'), current_setting('enable_seqscan'),"
                " current_setting('jit'), current_setting('idle_in_transaction_session_timeout')"
            ).fetchone()
        assert inside is not None and before is not None
        assert inside[:3] == before  # the function's SET clauses ended with it
        assert inside[3] == "12345ms"  # its set_config is the transaction's
        state = conn.execute("SELECT state FROM deadman.jobs WHERE id = %s", (job,)).fetchone()
    assert state == ("succeeded",)
