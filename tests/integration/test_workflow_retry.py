"""Retrying inside a dependency graph (migrations/0006): a retried job waits for its
unfinished dependencies, is refused while one is dead or cancelled, and reopens the
jobs that were cancelled because of it, unless another dead dependency still blocks
them. Against a real database, including a retry racing a sibling's completion."""

from __future__ import annotations

import threading
from typing import Any

import psycopg
import pytest
from psycopg.rows import DictRow

from deadman.db.queries import QUERIES
from deadman.model import JobState
from tests.factories import connect, job_row, with_store
from tests.helpers import wait_for
from tests.helpers.api import api_client, assert_problem
from tests.helpers.workflows import (
    DIAMOND,
    claim,
    conn,
    create,
    finals,
    finish,
    lock_waiters,
    nodes,
    run,
    workflow,
)

__all__ = ["conn"]  # the fixture, used by name


def retry(dsn: str, job_id: int) -> Any:
    with api_client(dsn) as c:
        return c.post(f"/jobs/{job_id}/retry")


def states(c: psycopg.Connection[DictRow], wf: int) -> dict[str, tuple[str, int]]:
    return {k: (v["state"], v["pending_deps"]) for k, v in nodes(c, wf).items()}


def test_retrying_a_dead_node_reopens_what_it_cancelled_and_the_workflow_finishes(
    db_dsn: str, conn: psycopg.Connection[DictRow]
) -> None:
    wf = create(db_dsn, DIAMOND)
    run(conn, nodes(conn, wf)["a"]["id"], JobState.DEAD)
    assert workflow(conn, wf)["state"] == "failed"
    r = retry(db_dsn, nodes(conn, wf)["a"]["id"])
    assert r.status_code == 200, r.text
    assert r.json()["state"] == "queued"
    assert states(conn, wf) == {
        "a": ("queued", 0),
        "b": ("waiting", 1),
        "c": ("waiting", 1),
        "d": ("waiting", 2),
    }
    row = workflow(conn, wf)
    assert (row["state"], row["unfinished"], row["failed"], row["cancelled"]) == (
        "running",
        4,
        0,
        0,
    )
    for name in "abcd":
        run(conn, nodes(conn, wf)[name]["id"])
    assert workflow(conn, wf)["state"] == "succeeded"
    assert finals(conn, wf) == ["failed", "succeeded"]


def test_retrying_a_node_cancelled_by_its_upstream_is_refused_naming_the_upstream(
    db_dsn: str, conn: psycopg.Connection[DictRow]
) -> None:
    wf = create(db_dsn, DIAMOND)
    run(conn, nodes(conn, wf)["a"]["id"], JobState.DEAD)
    r = retry(db_dsn, nodes(conn, wf)["b"]["id"])
    assert_problem(r, 409)
    assert "a (dead)" in r.json()["detail"]
    assert states(conn, wf)["b"] == ("cancelled", 1)


def test_a_job_blocked_by_another_dead_dependency_stays_cancelled_until_that_is_retried(
    db_dsn: str, conn: psycopg.Connection[DictRow]
) -> None:
    wf = create(db_dsn, DIAMOND)
    n = nodes(conn, wf)
    run(conn, n["a"]["id"])
    run(conn, n["b"]["id"], JobState.DEAD)  # d cancelled: upstream b dead
    run(conn, n["c"]["id"], JobState.DEAD)  # d already cancelled
    assert retry(db_dsn, n["b"]["id"]).status_code == 200
    assert states(conn, wf)["d"] == ("cancelled", 2)  # c is still dead
    assert retry(db_dsn, n["c"]["id"]).status_code == 200
    assert states(conn, wf)["d"] == ("waiting", 2)
    run(conn, n["b"]["id"])
    run(conn, n["c"]["id"])
    assert states(conn, wf)["d"] == ("queued", 0)
    run(conn, n["d"]["id"])
    assert workflow(conn, wf)["state"] == "succeeded"


def test_a_node_cancelled_by_hand_is_not_reopened_by_its_upstreams_retry(
    db_dsn: str, conn: psycopg.Connection[DictRow]
) -> None:
    wf = create(db_dsn, DIAMOND)
    n = nodes(conn, wf)
    with api_client(db_dsn) as c:
        assert c.post(f"/jobs/{n['d']['id']}/cancel").status_code == 200
    run(conn, n["a"]["id"], JobState.DEAD)
    assert retry(db_dsn, n["a"]["id"]).status_code == 200
    got = states(conn, wf)
    assert (got["b"][0], got["c"][0], got["d"][0]) == ("waiting", "waiting", "cancelled")


def test_retrying_a_cancelled_job_with_unfinished_dependencies_makes_it_wait(
    db_dsn: str, conn: psycopg.Connection[DictRow]
) -> None:
    wf = create(db_dsn, DIAMOND)
    n = nodes(conn, wf)
    with api_client(db_dsn) as c:
        assert c.post(f"/jobs/{n['b']['id']}/cancel").status_code == 200
        r = c.post(f"/jobs/{n['b']['id']}/retry")
        assert r.status_code == 200, r.text
        assert r.json()["state"] == "waiting"
    run(conn, n["a"]["id"])
    assert states(conn, wf)["b"] == ("queued", 0)


def test_dlq_replay_skips_jobs_whose_dependency_is_dead(
    db_dsn: str, conn: psycopg.Connection[DictRow]
) -> None:
    """b expired (start_by) while waiting and its dependency a died. A bulk replay
    that does not include a passes over b instead of leaving it waiting forever; one
    that includes a replays a first (id order), and b then waits for it."""
    wf = create(db_dsn, DIAMOND)
    n = nodes(conn, wf)
    a, b = n["a"]["id"], n["b"]["id"]
    conn.execute(
        "UPDATE deadman.jobs SET state = 'dead', finished_at = now(), last_error = 'expired'"
        " WHERE id = %s",
        (b,),
    )
    conn.execute("UPDATE deadman.jobs SET queue = 'elsewhere' WHERE id = %s", (a,))
    run(conn, a, JobState.DEAD)
    replayed = with_store(db_dsn, lambda s: s.job_retry_dead_many(None, "default", batch=1))
    assert replayed == []
    assert job_row(conn, b)["state"] == "dead"
    replayed = with_store(db_dsn, lambda s: s.job_retry_dead_many(None, None, batch=1))
    assert replayed == [a, b]
    assert states(conn, wf)["b"] == ("waiting", 1)


@pytest.mark.parametrize("first", ["retry", "completion"])
def test_a_retry_racing_a_sibling_completion_never_strands_the_reopened_job(
    db_dsn: str, conn: psycopg.Connection[DictRow], first: str
) -> None:
    """d waits on b and c. b died (d cancelled); c is running. The retry of b (which
    reopens d and recounts its dependencies) and c's completion run at the same
    moment, in both commit orders: d's count must end at 1 (only b unfinished), so
    that b's success releases it."""
    wf = create(db_dsn, DIAMOND)
    n = nodes(conn, wf)
    run(conn, n["a"]["id"])
    run(conn, n["b"]["id"], JobState.DEAD)
    token = claim(conn, n["c"]["id"])
    with (
        connect(db_dsn, autocommit=False) as tx_retry,
        connect(db_dsn, autocommit=False) as tx_finish,
    ):

        def do_retry() -> None:
            rows = tx_retry.execute(QUERIES["job_retry"], {"id": n["b"]["id"]}).fetchall()
            assert len(rows) == 1

        def do_finish() -> None:
            finish(tx_finish, n["c"]["id"], token, JobState.SUCCEEDED)

        one, two = (do_retry, do_finish) if first == "retry" else (do_finish, do_retry)
        tx_one, tx_two = (tx_retry, tx_finish) if first == "retry" else (tx_finish, tx_retry)
        one()

        def second() -> None:
            two()
            tx_two.commit()

        t = threading.Thread(target=second)
        t.start()
        wait_for(lambda: lock_waiters(conn), timeout=5, message="the second to wait on a lock")
        tx_one.commit()
        t.join(timeout=10)
        assert not t.is_alive()
    assert states(conn, wf)["d"] == ("waiting", 1)
    run(conn, n["b"]["id"])
    assert states(conn, wf)["d"] == ("queued", 0)
