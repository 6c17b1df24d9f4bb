"""job_succeed_in (ctx.transaction()'s fenced completion, DECISIONS 113) is the success
that job_finish_many writes for one attempt, in one UPDATE by primary key. It is a
second definition of that write, so this holds the two together: twin jobs, one
finished by each statement, must end field for field alike (ids, tokens and
timestamps aside, which are checked for what they must be), release the same
dependents, log no attempt row, and be refused alike once the lease is gone. A column
that job_finish_many starts writing on success and job_succeed_in does not fails here.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from psycopg.rows import DictRow

from deadman.client import Client
from deadman.db.queries import QUERIES
from deadman.model import AttemptOutcome, JobState
from deadman.store import Finish, SyncStore, finish_params
from tests.factories import attempt_rows, connect, insert_job, job_row
from tests.helpers.worker import SETTINGS

#: the twins' rows differ in these by construction; checked on their own
OWN = {"id", "created_at", "started_at", "finished_at", "finished_token", "lease_token"}


def _by_finish_many(conn: psycopg.Connection[DictRow], f: Finish) -> bool:
    with conn.transaction():
        rows = conn.execute(QUERIES["job_finish_many"], finish_params([f])).fetchall()
    return [r["id"] for r in rows] == [f.id]


def _by_succeed_in(conn: psycopg.Connection[DictRow], f: Finish) -> bool:
    with conn.transaction():
        return SyncStore().job_succeed_in(conn, f)


def _shape(row: dict[str, Any], token: int) -> dict[str, Any]:
    """The row as the twins must share it: its own id, token and times replaced by
    what they must be."""
    assert row["finished_token"] == token, "finished_token is the attempt's token"
    assert row["lease_token"] is None and row["lease_expires_at"] is None
    assert isinstance(row["finished_at"], datetime)
    assert row["finished_at"] >= row["started_at"]
    return {k: v for k, v in row.items() if k not in OWN}


def _twins(conn: psycopg.Connection[DictRow], **kw: Any) -> list[tuple[int, int]]:
    """Two running jobs alike in everything but id and token (one run_at for both)."""
    at = datetime(2026, 1, 1, tzinfo=UTC)
    made = [insert_job(conn, state="running", run_at=at, **kw) for _ in range(2)]
    return [(m.id, m.lease_token) for m in made if m.lease_token is not None]


@pytest.mark.parametrize(
    ("kw", "result"),
    [
        ({}, {"ok": True, "n": [1, 2.5, "x"]}),
        ({}, None),
        ({"cancel_requested": True}, "cancel came too late"),
        ({"attempt": 3, "last_error": "ValueError: the first two failed"}, 10**30),
        ({"payload": {"big": "y" * 5000}, "priority": 7, "queue": "q.other"}, "x" * 10_000),
        # big, deep and odd results: ~1 MiB, 33 levels of nesting, any code point
        ({}, {"blob": "z" * (1024 * 1024 - 64), "n": -(2**63)}),
        ({}, {"deep": [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[0]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}),
        ({}, {"text": "ünïcödé \u2028 \U0001f600 \\ \" ' $1 %(x)s"}),
    ],
    ids=[
        "plain",
        "no-result",
        "cancel-requested",
        "third-attempt",
        "wide-row",
        "a-mebibyte",
        "nested",
        "odd-text",
    ],
)
def test_a_success_is_written_as_job_finish_many_writes_it(
    db_dsn: str, kw: dict[str, Any], result: Any
) -> None:
    with connect(db_dsn) as conn:
        (a, ta), (b, tb) = _twins(conn, **kw)
        win = JobState.SUCCEEDED, AttemptOutcome.SUCCEEDED
        assert _by_finish_many(conn, Finish(a, ta, *win, result=result))
        assert _by_succeed_in(conn, Finish(b, tb, *win, result=result))
        assert _shape(dict(job_row(conn, b)), tb) == _shape(dict(job_row(conn, a)), ta)
        assert job_row(conn, b)["result"] == result
        # a succeeded attempt lives in its job's row (DECISIONS 76), not in the log
        assert [r["outcome"] for r in attempt_rows(conn, a)] == ["succeeded"]
        assert [r["outcome"] for r in attempt_rows(conn, b)] == ["succeeded"]
        assert conn.execute("SELECT count(*) AS n FROM deadman.attempt_log").fetchone() == {"n": 0}


def test_both_release_a_dependent_alike(db_dsn: str) -> None:
    with Client(db_dsn, settings=SETTINGS) as client, connect(db_dsn) as conn:
        ups = [client.enqueue("t"), client.enqueue("t")]
        downs = [client.enqueue("t", depends_on=[up.id]) for up in ups]
        tokens = []
        for up in ups:
            row = conn.execute(
                "UPDATE deadman.jobs SET state = 'running', attempt = 1,"
                " lease_token = nextval('deadman.lease_token_seq'), lease_worker = 'w',"
                " lease_expires_at = now() + interval '30 seconds', started_at = now()"
                " WHERE id = %s RETURNING lease_token",
                (up.id,),
            ).fetchone()
            assert row is not None
            tokens.append(row["lease_token"])
        assert [job_row(conn, d.id)["state"] for d in downs] == ["waiting", "waiting"]
        win = JobState.SUCCEEDED, AttemptOutcome.SUCCEEDED
        assert _by_finish_many(conn, Finish(ups[0].id, tokens[0], *win))
        assert _by_succeed_in(conn, Finish(ups[1].id, tokens[1], *win))
        released = [job_row(conn, d.id) for d in downs]
    assert [r["state"] for r in released] == ["queued", "queued"]
    assert [r["pending_deps"] for r in released] == [0, 0]


def test_both_refuse_a_lease_that_is_gone(db_dsn: str) -> None:
    with connect(db_dsn) as conn:
        (a, ta), (b, tb) = _twins(conn)
        win = JobState.SUCCEEDED, AttemptOutcome.SUCCEEDED
        # a stale token: the job was rescued and claimed again meanwhile
        assert not _by_finish_many(conn, Finish(a, ta - 10**6, *win))
        assert not _by_succeed_in(conn, Finish(b, tb - 10**6, *win))
        rows = [job_row(conn, a), job_row(conn, b)]
    assert [r["state"] for r in rows] == ["running", "running"]
    assert [r["lease_token"] for r in rows] == [ta, tb]


def test_it_arms_the_transactions_idle_limit_and_writes_successes_only(db_dsn: str) -> None:
    with connect(db_dsn) as conn:
        ((a, ta),) = _twins(conn)[:1]
        before = conn.execute("SHOW idle_in_transaction_session_timeout").fetchone()
        with conn.transaction():
            win = Finish(a, ta, JobState.SUCCEEDED, AttemptOutcome.SUCCEEDED)
            assert SyncStore().job_succeed_in(conn, win, idle_ms=12_345)
            armed = conn.execute("SHOW idle_in_transaction_session_timeout").fetchone()
        after = conn.execute("SHOW idle_in_transaction_session_timeout").fetchone()
        assert armed is not None and armed["idle_in_transaction_session_timeout"] == "12345ms"
        assert after == before  # local to the transaction
        with pytest.raises(ValueError, match="successes only"):
            SyncStore().job_succeed_in(conn, Finish(a, ta, JobState.DEAD, AttemptOutcome.FAILED))
